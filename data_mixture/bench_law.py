"""Loss-to-benchmark law: accuracy as a sigmoid of a (combination of) validation loss(es).

    acc = floor + (ceiling - floor) / (1 + exp(k (L - L0))),     L = sum_v w_v loss_v

* ``floor``: the task's chance level when known (``chance=``; fixed), else fitted in [0, 1].
* ``ceiling`` in [floor, 1], ``k`` > 0 (accuracy falls as loss grows), ``L0`` the loss at the
  midpoint.
* ``w``: non-negative weights summing to 1 over the table's validation domains, so ``L`` is in
  loss units. Candidates: every single domain (w one-hot) and the fitted combination; the one
  with the lowest BIC (n log(RSS / n) + p log n) wins, so the combination is chosen only when
  its V - 1 extra weights earn their keep. Every candidate's BIC is kept in ``info``.

Scores must be fractions in [0, 1]. The fit minimises squared error of accuracy (Huber with
delta = 1, which is quadratic for every possible residual) with the same vmapped multi-start
L-BFGS + L-BFGS-B polish as the loss laws (``solver.py``). Internally losses are standardised
(pooled mean and std over the used domains, stored in ``info``); ``params`` are in loss units.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from data_mixture.solver import Fitter, Param, ParamSpec, starts_rng
from data_mixture.table import RunsTable, TableError

MIN_SCORES = 5
_FITTERS: dict[tuple[int, bool], Fitter] = {}


def _spec(v: int, floor_fixed: bool) -> ParamSpec:
    ps = [] if floor_fixed else [Param("floor", (), 0.0, 1.0, (0.0, 0.5))]
    ps += [
        Param("c", (), 0.0, 1.0, (0.05, 1.0), doc="ceiling = floor + (1 - floor) c"),
        Param("k", (), 1e-3, 1e3, (0.3, 10.0), log=True, doc="slope in standardised loss units"),
        Param("L0", (), -10.0, 10.0, (-2.0, 2.0), doc="midpoint in standardised loss units"),
    ]
    if v > 1:
        ps.append(Param("w", (v,), 1e-9, 1.0, (0.05, 1.0), doc="unnormalised domain weights"))
    return ParamSpec(ps)


def _predict_z(x, data):
    floor = x["floor"] if "floor" in x else data["floor"]
    z = data["z"]
    if "w" in x:
        w = x["w"] / jnp.sum(x["w"])
        zc = z @ w
    else:
        zc = z[:, 0]
    ceiling = floor + (1.0 - floor) * x["c"]
    return floor + (ceiling - floor) * jax.nn.sigmoid(-x["k"] * (zc - x["L0"]))


def _fitter(v: int, floor_fixed: bool) -> Fitter:
    key = (v, floor_fixed)
    if key not in _FITTERS:
        _FITTERS[key] = Fitter(_spec(v, floor_fixed), _predict_z, delta=1.0, iters=150)
    return _FITTERS[key]


@dataclasses.dataclass
class BenchFit:
    """One task's law. params: floor, ceiling, k, L0 (loss units) and weights {loss domain: w}."""

    task: str
    loss_domains: tuple[str, ...]
    params: dict
    info: dict

    def predict(self, loss_rv: np.ndarray) -> np.ndarray:
        """(R,) accuracy from losses (R, V) in the order of ``loss_domains``."""
        loss_rv = np.asarray(loss_rv, np.float64)
        if loss_rv.ndim != 2 or loss_rv.shape[1] != len(self.loss_domains):
            raise TableError(f"loss_rv has shape {loss_rv.shape}; the law of task {self.task!r} expects (R, {len(self.loss_domains)}) with columns {', '.join(self.loss_domains)}.")
        p = self.params
        w = np.array([p["weights"][d] for d in self.loss_domains])
        loss = loss_rv @ w
        return p["floor"] + (p["ceiling"] - p["floor"]) / (1.0 + np.exp(np.clip(p["k"] * (loss - p["L0"]), -700, 700)))

    def to_json(self) -> dict:
        return {"task": self.task, "loss_domains": list(self.loss_domains), "params": self.params, "info": self.info}

    @classmethod
    def from_json(cls, d: dict) -> "BenchFit":
        return cls(d["task"], tuple(d["loss_domains"]), d["params"], d["info"])


def _task_data(table: RunsTable, task: str, chance: float | None):
    if task not in table.bench_tasks:
        raise TableError(f"benchmark task {task!r} is not in the table (column 'bench:{task}'); its tasks: {', '.join(table.bench_tasks) or 'none'}.")
    if table.loss_rv is None:
        raise TableError("the table has no loss:* columns; a benchmark law maps losses to scores.")
    acc = table.bench_rt[:, table.bench_tasks.index(task)]
    have = np.isfinite(acc)
    if have.sum() < MIN_SCORES:
        raise TableError(f"task {task!r} has scores in {int(have.sum())} rows; its law needs at least {MIN_SCORES}.")
    bad = np.flatnonzero(have & ((acc < 0) | (acc > 1)))
    if bad.size:
        from data_mixture.table import _rows

        raise TableError(f"column 'bench:{task}': {_rows(bad, table.run, [float(acc[i]) for i in bad])}; allowed: scores as fractions in [0, 1] (divide percentages by 100).")
    if chance is not None and not (0.0 <= chance < 1.0):
        raise TableError(f"chance level of task {task!r} is {chance!r}; allowed: a fraction in [0, 1).")
    return acc, have


def _standardise(loss_rv: np.ndarray, have: np.ndarray, cols: list[int]) -> tuple[float, float]:
    vals = loss_rv[have][:, cols]
    mu = float(np.mean(vals))
    sd = float(np.std(vals)) or 1.0
    return mu, sd


def _to_params(x: dict, cols: list[int], domains: tuple[str, ...], mu: float, sd: float, chance: float | None) -> dict:
    floor = float(chance) if chance is not None else float(x["floor"])
    w = np.zeros(len(domains))
    if "w" in x:
        w[cols] = np.asarray(x["w"]) / np.sum(x["w"])
    else:
        w[cols[0]] = 1.0
    return {
        "floor": floor,
        "ceiling": floor + (1.0 - floor) * float(x["c"]),
        "k": float(x["k"]) / sd,
        "L0": mu + sd * float(x["L0"]),
        "weights": {d: float(w[i]) for i, d in enumerate(domains)},
    }


def _solve(table, acc, have, cols, chance, w0_qsp, weights_qr, polish, iters=None):
    mu, sd = _standardise(table.loss_rv, have, cols)
    z = (table.loss_rv[:, cols] - mu) / sd
    data = {"z": np.where(np.isfinite(z), z, 0.0)}
    if chance is not None:
        data["floor"] = np.asarray(chance, np.float64)
    y = np.where(have, acc, 0.0)
    wts = weights_qr * have[None, :]
    fitter = _fitter(len(cols), chance is not None)
    w, v, infos = fitter.solve(w0_qsp, data, np.repeat(y[None], w0_qsp.shape[0], 0), wts, polish=polish, iters=iters)
    return fitter.spec, w, v, infos, mu, sd


def fit_bench(table: RunsTable, task: str, *, chance: float | None = None, seed: int = 0, starts: int = 64, weights: np.ndarray | None = None) -> BenchFit:
    """Fits task ``task`` on the table's observed losses; picks the loss combination by BIC."""
    acc, have = _task_data(table, task, chance)
    v = len(table.loss_domains)
    wts = np.ones(len(table)) if weights is None else np.asarray(weights, np.float64)
    n = float(np.sum(wts * have))
    candidates: dict[str, tuple[list[int], Any]] = {f"single:{d}": ([i], None) for i, d in enumerate(table.loss_domains)}
    if v > 1:
        candidates["combination"] = (list(range(v)), None)
    results = {}
    for ci, (name, (cols, _)) in enumerate(candidates.items()):
        spec = _spec(len(cols), chance is not None)
        w0 = spec.sample(starts_rng(seed, 11, ci), max(1, starts))[None]
        spec, w, val, infos, mu, sd = _solve(table, acc, have, cols, chance, w0, wts[None], polish=2)
        x = spec.unpack(w[0])
        p = _to_params(x, cols, table.loss_domains, mu, sd, chance)
        pred = BenchFit(task, table.loss_domains, p, {}).predict(np.where(np.isfinite(table.loss_rv), table.loss_rv, 0.0))
        rss = float(np.sum(wts * have * (pred - np.where(have, acc, 0.0)) ** 2))
        bic = n * math.log(max(rss, 1e-300) / n) + spec.size * math.log(n)
        results[name] = {"params": p, "bic": bic, "rss": rss, "num_params": spec.size, "w": w[0].tolist(), "mu": mu, "sd": sd}
    best = min(results, key=lambda k: results[k]["bic"])
    r = results[best]
    info = {
        "selected": best,
        "bic": {k: v["bic"] for k, v in results.items()},
        "rss": r["rss"],
        "num_params": r["num_params"],
        "n_scores": int(have.sum()),
        "chance": chance,
        "_working": r["w"],
        "_mu_sd": [r["mu"], r["sd"]],
    }
    return BenchFit(task, table.loss_domains, r["params"], info)


def fit_bench_bootstrap(table: RunsTable, point: BenchFit, weights_br: np.ndarray, *, seed: int = 0, starts: int = 4) -> list[BenchFit]:
    """One fit per resample of the point fit's selected candidate, warm-started from it."""
    acc, have = _task_data(table, point.task, point.info["chance"])
    chance = point.info["chance"]
    sel = point.info["selected"]
    cols = list(range(len(table.loss_domains))) if sel == "combination" else [table.loss_domains.index(sel.split(":", 1)[1])]
    spec = _spec(len(cols), chance is not None)
    b = weights_br.shape[0]
    w_point = np.asarray(point.info["_working"])
    w0 = np.stack([np.concatenate([w_point[None], spec.sample(starts_rng(seed, 12, i), max(0, starts - 1))]) for i in range(b)])
    spec, w, val, infos, mu, sd = _solve(table, acc, have, cols, chance, w0, weights_br, polish=0, iters=80)
    out = []
    for i in range(b):
        p = _to_params(spec.unpack(w[i]), cols, table.loss_domains, mu, sd, chance)
        out.append(BenchFit(point.task, table.loss_domains, p, {"selected": sel, "chance": chance, "resample": i}))
    return out
