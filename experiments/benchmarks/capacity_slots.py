"""The capacity backend's slot count: a one-hot ``[groups, k x tokens, E]`` cumsum (before) against
one stable sort per group (now, :func:`moejax.model.llep.rank_within`): the same slots (asserted),
at 16 experts top-2 and 128 top-8, 16 groups of 256 tokens, jitted, interleaved rounds, medians.

    ./launch.sh python -m experiments.benchmarks.capacity_slots [--rounds 20] [--out results/capacity_slots.json]
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.timing import machine, write_json
from moejax.model.llep import rank_within


def sort_slots(idx_gtk, e):
    g, t, k = idx_gtk.shape
    expert_gq = jnp.swapaxes(idx_gtk, 1, 2).reshape(g, k * t).astype(jnp.int32)
    slot_gq = jax.vmap(lambda expert_q: rank_within(expert_q, e))(expert_gq)
    return jnp.swapaxes(slot_gq.reshape(g, k, t), 1, 2)


def onehot_slots(idx_gtk, e):
    g, t, k = idx_gtk.shape
    expert_gqe = jnp.swapaxes(jax.nn.one_hot(idx_gtk, e, dtype=jnp.int32), 1, 2).reshape(g, k * t, e)
    earlier_gqe = jnp.cumsum(expert_gqe, axis=1) - expert_gqe
    return jnp.swapaxes(jnp.sum(earlier_gqe * expert_gqe, -1).reshape(g, k, t), 1, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default="results/capacity_slots.json")
    args = p.parse_args()
    before, rows = machine(), []
    for e, k in ((16, 2), (128, 8)):
        idx_gtk = jax.lax.top_k(jax.random.normal(jax.random.key(0), (16, 256, e)), k)[1].astype(jnp.int32)
        fns = {"onehot": jax.jit(functools.partial(onehot_slots, e=e)), "sort": jax.jit(functools.partial(sort_slots, e=e))}
        assert (np.asarray(fns["onehot"](idx_gtk)) == np.asarray(fns["sort"](idx_gtk))).all()
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                start = time.perf_counter()
                jax.block_until_ready(fn(idx_gtk))
                samples[name].append(time.perf_counter() - start)
        med = {name: float(np.median(s)) for name, s in samples.items()}
        rows.append({"experts": e, "top_k": k, "onehot_ms": med["onehot"] * 1e3, "sort_ms": med["sort"] * 1e3})
        print(f"{e} experts top-{k}: one-hot {med['onehot'] * 1e3:.2f} ms, sort {med['sort'] * 1e3:.2f} ms")
    write_json(args.out, {"rows": rows, "rounds": args.rounds, "machine_before": before, "machine_after": machine()})


if __name__ == "__main__":
    main()
