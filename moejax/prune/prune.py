"""Pruning one checkpoint: calibration, a method's choice of experts per layer, the pruned workdir.

:func:`choose` runs a method on a :class:`~moejax.prune.calibration.Calibration` and returns, per
MoE layer, the kept experts (and any replaced weights, with the method's diagnostics);
:func:`prune_workdir` does the whole job the command line does.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import numpy as np

from moejax.errors import ConfigError
from moejax.eval.restore import open_run
from moejax.model.transformer import is_moe_layer
from moejax.prune import knee as knee_lib
from moejax.prune.calibration import Calibration, collect
from moejax.prune.least_used import least_used_keep
from moejax.prune.objectives import min_tokens, pruned_layer_error, quadratic
from moejax.prune.schur_astar import distortion_curve, schur_astar
from moejax.prune.step import refit_down, step_keep
from moejax.prune.write import write_pruned

METHODS = ("schur_astar", "step", "least_used")
DEFAULT_CALIB_TOKENS = 4096


@dataclasses.dataclass(frozen=True)
class Budget:
    """How many experts each layer keeps: ``keep`` per layer, ``ratio`` removed per layer, or
    ``auto`` (knee per layer; with ``ratio`` or ``keep`` as a global target over all layers)."""

    keep: int | None = None
    ratio: float | None = None
    auto: bool = False

    def check(self) -> None:
        if self.keep is None and self.ratio is None and not self.auto:
            raise ConfigError("say how many experts to keep: --keep K, --ratio R or --auto.")
        if self.keep is not None and self.ratio is not None:
            raise ConfigError("pass one of --keep and --ratio, not both.")
        if self.ratio is not None and not 0.0 <= self.ratio < 1.0:
            raise ConfigError(f"--ratio {self.ratio} must be in [0, 1): the fraction of experts removed.")

    def per_layer(self, experts: list[int], top_k: int) -> list[int] | None:
        """Counts per layer, or None when the knee decides (``auto``)."""
        if self.auto:
            return None
        counts = []
        for layer, e in enumerate(experts):
            k = self.keep if self.keep is not None else int(round((1.0 - float(self.ratio or 0.0)) * e))
            if k > e:
                raise ConfigError(f"--keep {k} is more than MoE layer {layer}'s {e} experts.")
            if k < top_k:
                raise ConfigError(f"keeping {k} experts in MoE layer {layer} is fewer than the {top_k} each token "
                                  f"chooses (top-k): keep at least {top_k}.")
            counts.append(k)
        return counts

    def total(self, experts: list[int]) -> int | None:
        """The global target of ``auto`` in experts, or None (knees alone)."""
        if self.keep is not None:
            return self.keep * len(experts)
        if self.ratio is not None:
            return int(round((1.0 - self.ratio) * sum(experts)))
        return None


def choose(cal: Calibration, method: str, budget: Budget, *, max_nodes: int = 200_000,
           max_seconds: float = 60.0, layers: tuple[int, ...] | None = None,
           refit: bool | None = None) -> dict[str, Any]:
    """Per MoE layer: ``keep`` (sorted ids), ``replaced`` (new weights or None) and ``layers``
    (diagnostics: objective value, search effort, measured reconstruction error). ``layers``:
    the decoder layers to prune (the other MoE layers keep every expert); None: all. ``refit``:
    apply Step's knowledge-preserving refit of the kept experts' down projections
    (:func:`moejax.prune.step.refit_down`) after the selection; None: only for ``step``."""
    if method not in METHODS:
        raise ConfigError(f"--method {method!r} is unknown; choose one of {', '.join(METHODS)}.")
    budget.check()
    experts = [data.num_experts for data in cal.layers]
    counts = budget.per_layer(experts, cal.top_k)
    quads = [quadratic(data) for data in cal.layers]
    curves = None
    if counts is None:  # --auto: the optimal distortion curve of every layer, then the knees
        curves_full = [distortion_curve(q, cal.top_k, max_nodes=max_nodes, max_seconds=max_seconds) for q in quads]
        curves = [{k: r.distortion / max(q.yy, 1e-30) for k, r in c.items()} for c, q in zip(curves_full, quads)]
        total = budget.total(experts)
        try:
            counts = knee_lib.allocate(curves, total) if total is not None else [knee_lib.knee(c) for c in curves]
        except ValueError as e:
            raise ConfigError(f"--auto: {e}") from None
    route: dict[str, Any] = dict(top_k=cal.top_k, renormalize=cal.renormalize, scaling=cal.routed_scaling, score_func=cal.score_func)
    keep: list[tuple[int, ...]] = []
    replaced: list[dict[str, np.ndarray] | None] = []
    infos: list[dict[str, Any]] = []
    for data, q, k in zip(cal.layers, quads, counts):
        if layers is not None and data.layer not in layers:
            k = data.num_experts
        info: dict[str, Any] = {"layer": data.layer, "experts": data.num_experts, "keep": k}
        weights = None
        if k == data.num_experts:
            chosen = tuple(range(k))
        elif method == "schur_astar":
            result = schur_astar(q, k, max_nodes=max_nodes, max_seconds=max_seconds)
            chosen = result.keep
            info.update(optimal=result.optimal, nodes=result.nodes, search_seconds=result.seconds,
                        lower_bound=result.lower_bound / max(q.yy, 1e-30), stopped_by=result.stopped_by)
        elif method == "step":
            chosen = step_keep(data, cal.loss_t, k)
        else:
            chosen = least_used_keep(data, k)
        if (method == "step" if refit is None else refit) and k < data.num_experts:
            fit = refit_down(data, cal.loss_t, chosen, **route)
            weights = {"w_down_efd": fit.w_down_efd}
            info.update(ridge=fit.ridge, heldout_error=fit.heldout_error)
        info["objective"] = q.relative(chosen)  # D(S) / ||Y||^2, the Schur-A* objective, for every method
        full = None if weights is None else {
            "w_gate_edf": data.w_gate_edf, "w_up_edf": data.w_up_edf, "w_down_efd": weights["w_down_efd"]}
        info["recon_error"] = pruned_layer_error(data, chosen, weights=full, **route)
        if curves is not None:
            info["curve"] = {str(kk): v for kk, v in curves[len(keep)].items()}
            info["knee"] = knee_lib.knee(curves[len(keep)])
        keep.append(tuple(int(e) for e in chosen))
        replaced.append(weights)
        infos.append(info)
    return {"keep": keep, "replaced": replaced, "layers": infos}


def prune_workdir(workdir: str, out: str, method: str, budget: Budget, *, step: int | None = None,
                  calib_tokens: int = DEFAULT_CALIB_TOKENS, max_nodes: int = 200_000,
                  max_seconds: float = 60.0, layers: tuple[int, ...] | None = None,
                  refit: bool | None = None) -> dict[str, Any]:
    """Calibrate, choose, write: the command line's job. Returns the pruned workdir's record.

    ``layers``: the decoder layers to prune (MoE layers only; the others keep all their experts);
    None: every MoE layer."""
    budget.check()
    if os.path.lexists(out):
        raise ConfigError(f"--out {out} already exists; the pruned workdir is written to a new path. Choose "
                          "another --out, or remove it first.")
    start = time.perf_counter()
    erun = open_run(workdir)
    moe = erun.cfg.model.moe
    if moe.num_groups > 1:
        raise ConfigError(f"{workdir} routes in {moe.num_groups} expert groups (model.moe.num_groups); pruning "
                          "would leave unequal groups, which group-limited routing cannot express.")
    moe_layers = [layer for layer in range(erun.cfg.model.num_layers) if is_moe_layer(erun.cfg.model, layer)]
    if not moe_layers:
        raise ConfigError(f"{workdir}: the model has no MoE layer, so there are no experts to prune.")
    check_layers(layers, moe_layers, erun.cfg.model.num_layers)
    experts = list(moe.layer_experts) or [moe.num_experts] * len(moe_layers)
    budget.per_layer(experts, moe.experts_per_token)
    ckpt = erun.load(step)
    need = min_tokens(moe.num_experts, erun.cfg.model.d_model)
    cal = collect(erun, ckpt, tokens=calib_tokens, min_tokens=need)
    chosen = choose(cal, method, budget, max_nodes=max_nodes, max_seconds=max_seconds, layers=layers, refit=refit)
    seconds = time.perf_counter() - start
    record = {
        "method": method, "refit": method == "step" if refit is None else refit, "budget": dataclasses.asdict(budget), "calib_tokens": cal.num_tokens,
        "prune_seconds": seconds, "layers": chosen["layers"],
    }
    return write_pruned(erun, ckpt, chosen["keep"], out, replaced=chosen["replaced"], record=record)


def check_layers(layers: tuple[int, ...] | None, moe_layers: list[int], num_layers: int) -> None:
    """``--layers`` names MoE layers only."""
    for layer in layers or ():
        if not 0 <= layer < num_layers:
            raise ConfigError(f"--layers {layer}: the model has layers 0..{num_layers - 1}.")
        if layer not in moe_layers:
            raise ConfigError(f"--layers {layer} is a dense layer (it has no experts to prune); the MoE layers "
                              f"are {moe_layers}.")


def describe(record: dict[str, Any]) -> str:
    """The summary the command line prints."""
    mib = lambda b: b / 2 ** 20
    lines = [
        f"pruned {record['source']} (step {record['step']}) with {record['method']}: experts per MoE layer "
        f"{record['experts_per_layer']} (was {record['experts_before']})",
        f"parameters: {record['params_after']:,} (was {record['params_before']:,}, "
        f"{100 * (1 - record['params_after'] / record['params_before']):.1f}% fewer)",
        f"parameter memory: {mib(record['param_bytes_after']):.2f} MiB (was {mib(record['param_bytes_before']):.2f} MiB)",
        f"pruning took {record['prune_seconds']:.1f} s on {record['calib_tokens']} calibration tokens",
    ]
    for info in record["layers"]:
        extra = ""
        if "optimal" in info:
            extra = f", {'optimal' if info['optimal'] else 'NOT proven optimal (' + info['stopped_by'] + ')'}, " \
                    f"{info['nodes']} nodes"
        lines.append(f"  layer {info['layer']}: keep {info['keep']}/{info['experts']}, objective "
                     f"{info['objective']:.4f}, reconstruction error {info['recon_error']:.4f}{extra}")
    return "\n".join(lines)

