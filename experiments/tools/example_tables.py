"""Two small synthetic runs tables for the examples of docs/mixture/tables.md ("Targets", "Repeated data").

    ./launch.sh python -m experiments.tools.example_tables --out results/dm_examples

writes ``targets_runs.csv`` (three training domains; a held-out target ``loss:heldout_qa`` with no
``mix:`` column that prose helps most, and its ``logprob:qa``) and ``repeated_runs.csv`` (three
training domains, ``code`` data-constrained: a pool of 5e7 unique tokens in ``unique:code``, losses
from ``additive+repfit`` with R* = 4). Both are drawn from known formulas with 0.2 % log-normal
noise, seed 0: deterministic, seconds.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

DOMAINS = ("code", "prose", "math")
POOL = 5e7
REPEATED_TRUTH = {"E": 1.2, "A": 0.6, "alpha": 0.35, "B": 0.8, "beta": 0.3, "C": [2.0, 1.5, 4.0],
                  "gamma": [0.5, 0.6, 0.45], "R_star": 4.0}
REPEATED_REFS = {"n_ref": 3e7, "d_ref": 6e8}


def _write(cols: dict, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(list(cols))
        for i in range(len(cols["run"])):
            w.writerow([repr(float(cols[c][i])) if isinstance(cols[c][i], (float, np.floating)) else cols[c][i] for c in cols])


def targets_columns(seed: int = 0) -> dict:
    """3 sizes x 8 mixtures x 2 checkpoints; each loss:<domain> best on its own domain, the held-out
    loss:heldout_qa best on prose (log-loss slopes 0.45, 0.05, 0.25), logprob:qa = -8 x heldout_qa."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("run", "params_total", "params_active", "tokens", *(f"mix:{d}" for d in DOMAINS),
                                             *(f"loss:{d}" for d in DOMAINS), "loss:heldout_qa", "logprob:qa")}
    slope = np.array([0.45, 0.05, 0.25])
    for n in (1e6, 3e6, 1e7):
        for k in range(8):
            mix = rng.dirichlet(np.ones(3))
            for d in (10 * n, 20 * n):
                scale = 0.3 * np.log(n / 3e6) + 0.2 * np.log(d / 6e7)
                cols["run"].append(f"n{n:.0e}_m{k}")
                cols["params_total"].append(n)
                cols["params_active"].append(n)
                cols["tokens"].append(d)
                for j, dom in enumerate(DOMAINS):
                    cols[f"mix:{dom}"].append(mix[j])
                    cols[f"loss:{dom}"].append(float(np.exp(0.6 - 0.5 * mix[j] - scale + 0.002 * rng.standard_normal())))
                qa = float(np.exp(0.9 + mix @ slope - scale + 0.002 * rng.standard_normal()))
                cols["loss:heldout_qa"].append(qa)
                cols["logprob:qa"].append(-8 * qa)
    return cols


def repeated_loss(size_r, tokens_r, mix_rm, pool=POOL) -> np.ndarray:
    """The data-constrained truth: ``additive+repfit`` at :data:`REPEATED_TRUTH` with code's pool ``pool``."""
    from data_mixture import get_law

    law = get_law("additive+repfit")
    with jax.enable_x64(True):
        data = {k: jnp.asarray(v) for k, v in law.features(size_r, tokens_r, mix_rm, {**REPEATED_REFS, "unique_tokens": [pool, None, None]}).items()}
        x = {k: jnp.asarray(v, jnp.float64) for k, v in REPEATED_TRUTH.items()}
        return np.asarray(jnp.exp(law.log_loss(x, data)))


def repeated_columns(seed: int = 0) -> dict:
    """3 sizes x 14 mixtures (the same at every size) x 3 checkpoints, code's pool 5e7 tokens."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("run", "params_total", "params_active", "tokens", *(f"mix:{d}" for d in DOMAINS), "unique:code")}
    mixes = rng.dirichlet(np.ones(3), 14)
    for n in (1e7, 3e7, 1e8):
        for k, mix in enumerate(mixes):
            for frac in (0.25, 0.5, 1.0):
                cols["run"].append(f"n{n:.0e}_m{k}")
                cols["params_total"].append(n)
                cols["params_active"].append(n)
                cols["tokens"].append(frac * 20 * n)
                for j, d in enumerate(DOMAINS):
                    cols[f"mix:{d}"].append(mix[j])
                cols["unique:code"].append(POOL)
    mix = np.stack([cols[f"mix:{d}"] for d in DOMAINS], 1)
    clean = repeated_loss(np.array(cols["params_total"]), np.array(cols["tokens"]), mix)
    cols["loss:valid"] = list(clean * np.exp(0.002 * rng.standard_normal(len(clean))))
    return cols


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/dm_examples", help="directory for the two CSVs")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write(targets_columns(), out / "targets_runs.csv")
    _write(repeated_columns(), out / "repeated_runs.csv")
    print(f"wrote {out / 'targets_runs.csv'} and {out / 'repeated_runs.csv'}")


if __name__ == "__main__":
    main()
