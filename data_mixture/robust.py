"""A pick that is best over the bootstrap, and its odds: the mixture a practitioner can trust.

A point fit's optimum is one draw of a noisy estimate; its bootstrap members (refits on resampled
runs, :mod:`data_mixture.fit`) are the others. Here every member predicts the objective (the
target loss, ``sum_v a_v L_v``) for every mixture at once, and

- the **robust pick** minimises a statistic of the members' predictions: their mean
  (``robust="mean"``, the default) or a quantile (``"q90"``: the 90th percentile, a pessimist's
  pick);
- every member's **own optimum** is found too, from the same candidates;
- the **report** gives the share of members whose own optimum lies within ``AGREE_TV`` = 0.05 total
  variation (``0.5 sum_j |w_j - v_j|``) of the pick; per baseline mixture, over the members, the
  probability that the pick's predicted objective is lower (the pick beats it) and the difference
  pick minus baseline (median and central ``interval``); and names the members whose own optimum
  sits on a **corner** -- a weight at 0 or 1, or at an upper bound (an epoch cap or max weight),
  within ``CORNER_TOL``.

Search (feasible set as :func:`data_mixture.optimize.feasible_bounds`): ``CANDIDATES`` feasible
candidates (plus the point optimum, the baselines and the box's corners) scored by all members in
one batched call, then projected gradient descent (exact gradients from ``jax.grad`` through the
laws' ``predict_jax``, every lane in one vectorised step; the projection is
:func:`data_mixture.optimize.project`) from the best ``starts`` candidates for the pick, and from
each member's best candidate for that member's optimum. The members' predictions are one jitted
function of the mixtures: the laws written in ``jax.numpy`` with their fitted parameters; a law
that is not (``regmix``) is scored member by member and searched over the candidates only (said in
``search.method``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

AGREE_TV = 0.05
CORNER_TOL = 1e-4
CANDIDATES = 4096
PGD_STEPS = 300
MIN_MEMBERS = 50
ROBUST = ("mean", "q90")


class RobustError(ValueError):
    """A robust pick that cannot be made: names the option, the value and what is allowed."""


def parse_robust(text: str | None) -> float | None:
    """``"mean"`` -> None (the mean), ``"qNN"`` -> the quantile NN/100; RobustError otherwise."""
    if text in (None, "mean"):
        return None
    t = str(text)
    if t.startswith("q") and t[1:].isdigit() and 0 < int(t[1:]) < 100:
        return int(t[1:]) / 100
    raise RobustError(f"--robust {text!r}; allowed: mean, or a quantile qNN with 0 < NN < 100 (e.g. q90).")


def _stacked_member_loss(fit, v: str, size: float, tokens: float, unique_m: np.ndarray | None) -> Callable | None:
    """``h(W_km) -> jnp (B, K)``: validation domain v's predicted loss for every member, one
    ``jax.vmap`` over the members' stacked parameters (the law's own ``log_loss`` on the features
    its ``predict_jax`` builds); None for a law whose prediction is not of that form."""
    import jax
    import jax.numpy as jnp

    from data_mixture.laws import get_law
    from data_mixture.laws.parametric import ParametricLaw
    from data_mixture.laws.repeated import unique_from_json

    fits = [member.get(v) if isinstance(member, dict) else None for member in fit.bootstrap]
    if any(f is None or not hasattr(f, "law") or not hasattr(f, "info") for f in fits):
        return None  # not the members of a data_mixture.fit.Fit
    law = get_law(fits[0].law)
    base = getattr(law, "base_law", None)
    repeated = base is not None
    plain = type(law).predict_jax is ParametricLaw.predict_jax
    if not isinstance(law, ParametricLaw) or not (plain or (repeated and base.predict_jax is ParametricLaw.predict_jax)):
        return None
    keys = list(fits[0].params)
    if any(isinstance(f.params[k], str) for f in fits for k in keys):
        return None
    x_b = {k: jnp.asarray(np.stack([np.asarray(f.params[k], np.float64) for f in fits])) for k in keys}
    info = fits[0].info
    if any(f.info.get("n_ref") != info["n_ref"] or f.info.get("d_ref") != info["d_ref"] for f in fits):
        return None
    logn, logd = float(np.log(size / info["n_ref"])), float(np.log(tokens / info["d_ref"]))
    ulog = None
    if repeated:
        m = len(fit.mix_domains)
        u = np.asarray(unique_m, np.float64) if unique_m is not None else unique_from_json(info.get("unique_tokens"), m)
        with np.errstate(divide="ignore"):
            ulog = np.log(u / info["d_ref"])

    def h(w_km):
        k = w_km.shape[0]
        data = {"logn": jnp.full((k,), logn), "logd": jnp.full((k,), logd), "mix": w_km}
        if ulog is not None:
            data["ulog"] = jnp.broadcast_to(jnp.asarray(ulog), w_km.shape)
        return jnp.exp(jax.vmap(lambda x: law.log_loss(x, data))(x_b))

    return h


def member_predictor(fit, size: float, tokens: float, a_v: np.ndarray,
                     unique_m: np.ndarray | None) -> tuple[Callable[[np.ndarray], np.ndarray], Callable | None]:
    """(G, jax_G): ``G(W_km) -> (B, K)`` numpy, each bootstrap member's objective ``sum_v a_v L_v``
    at size/tokens for K mixtures; ``jax_G`` the same as a jax function (None when a law's
    prediction is not one vmapped ``log_loss``: then G scores member by member)."""
    import jax
    import jax.numpy as jnp

    n_members = len(fit.bootstrap)
    used = [(v, float(a)) for v, a in zip(fit.loss_domains, a_v) if a > 0]
    parts = [(_stacked_member_loss(fit, v, size, tokens, unique_m), a) for v, a in used]

    def numpy_g(w_km):
        w_km = np.atleast_2d(w_km)
        k = w_km.shape[0]
        pools = {} if unique_m is None else {"unique_rm": unique_m}  # only repetition-aware fits take pools
        return np.stack([np.asarray(fit.predict_losses(np.full(k, size), np.full(k, tokens), w_km, member=b, **pools)) @ a_v
                         for b in range(n_members)])

    if any(h is None for h, _ in parts):
        return numpy_g, None

    def jax_g(w_km):
        return sum(a * h(w_km) for h, a in parts)

    jitted = jax.jit(jax_g)

    def g(w_km):  # called inside robust_pick's jax.enable_x64 block
        return np.asarray(jitted(jnp.asarray(np.atleast_2d(w_km), jnp.float64)), np.float64)

    return g, jax_g


def _statistic(q: float | None):
    """The robust statistic over members (axis 0), numpy and jax alike."""
    def stat(vals_bk, xp=np):
        return vals_bk.mean(axis=0) if q is None else xp.quantile(vals_bk, q, axis=0)
    return stat


def _pgd(value_grad: Callable, w_km: np.ndarray, lo_m, hi_m, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Projected gradient descent, one step size per lane (grown on success, halved on failure):
    ``value_grad(W) -> (vals_k, grads_km)``; returns the lanes' best points and values."""
    from data_mixture.simplex import project

    w = project(w_km, lo_m, hi_m)
    val, grad = value_grad(w)
    lr = np.full(w.shape[0], 0.1)
    last = val.copy()
    for step in range(steps):
        trial = project(w - lr[:, None] * grad, lo_m, hi_m)
        tval, tgrad = value_grad(trial)
        ok = np.isfinite(tval) & (tval < val)
        w = np.where(ok[:, None], trial, w)
        val = np.where(ok, tval, val)
        grad = np.where(ok[:, None], tgrad, grad)
        lr = np.where(ok, lr * 1.5, lr * 0.5)
        if np.all(lr < 1e-10):
            break
        if step % 20 == 19:  # converged: no lane improved by more than 1e-10 over 20 steps
            if np.all(last - val <= 1e-10):
                break
            last = val.copy()
    return w, val


def _value_grads(jax_g, q: float | None):
    """(pick's value_grad, members' value_grad) for :func:`_pgd`, exact gradients via jax."""
    import jax
    import jax.numpy as jnp

    stat = _statistic(q)

    def pick_sum(w_km):
        vals = stat(jax_g(w_km), jnp)
        return vals.sum(), vals

    def member_sum(w_bm):
        vals = jnp.diagonal(jax_g(w_bm))  # member b at its own lane b
        return vals.sum(), vals

    pick_vg = jax.jit(jax.value_and_grad(pick_sum, has_aux=True))
    member_vg = jax.jit(jax.value_and_grad(member_sum, has_aux=True))

    def wrap(f):
        def vg(w):
            (_, vals), grads = f(jnp.asarray(w, jnp.float64))
            return np.asarray(vals, np.float64), np.asarray(grads, np.float64)
        return vg

    return wrap(pick_vg), wrap(member_vg)


def tv(a_km: np.ndarray, b_m: np.ndarray) -> np.ndarray:
    """(K,) total variation distance of each row of ``a_km`` from ``b_m``."""
    return 0.5 * np.abs(np.atleast_2d(a_km) - np.asarray(b_m)[None]).sum(axis=1)


def corners(w_m: np.ndarray, lo_m: np.ndarray, hi_m: np.ndarray, domains: Sequence[str], caps: Mapping[str, str]) -> list[str]:
    """What puts ``w_m`` on a corner: ``"knowledge = 1"``, ``"code = 0"``, ``"knowledge at its
    repetition cap 0.333"`` (``caps``: the binding upper bound's kind per domain)."""
    out = []
    for j, d in enumerate(domains):
        if w_m[j] <= CORNER_TOL:
            out.append(f"{d} = 0")
        elif w_m[j] >= 1 - CORNER_TOL:
            out.append(f"{d} = 1")
        elif hi_m[j] < 1 and w_m[j] >= hi_m[j] - CORNER_TOL:
            out.append(f"{d} at its {caps.get(d, 'upper bound')} {hi_m[j]:.3g}")
    return out


def robust_pick(fit, *, size: float, tokens: float, a_v: np.ndarray, lo_m: np.ndarray, hi_m: np.ndarray,
                unique_m: np.ndarray | None, robust: str = "mean", point_w: np.ndarray | None = None,
                baselines: Mapping[str, Mapping[str, float]] | None = None, starts: int = 8, seed: int = 0,
                interval: float = 0.9, binding: Mapping[str, str] | None = None,
                steps: int = PGD_STEPS, candidates: int = CANDIDATES) -> dict[str, Any]:
    """The robust pick and its report (module docstring) as JSON-able dict."""
    import jax

    with jax.enable_x64(True):
        return _robust_pick(fit, size=size, tokens=tokens, a_v=a_v, lo_m=lo_m, hi_m=hi_m, unique_m=unique_m,
                            robust=robust, point_w=point_w, baselines=baselines, starts=starts, seed=seed,
                            interval=interval, binding=binding, steps=steps, candidates=candidates)


def _robust_pick(fit, *, size, tokens, a_v, lo_m, hi_m, unique_m, robust, point_w, baselines, starts, seed, interval,
                 binding, steps, candidates) -> dict[str, Any]:
    from data_mixture.simplex import check_feasible, project

    q = parse_robust(robust)
    domains = tuple(fit.mix_domains)
    n_members = len(fit.bootstrap or [])
    if n_members < 2:
        raise RobustError(f"a robust pick needs a bootstrapped fit; this fit has {n_members} member(s): refit with "
                          f"--bootstrap {MIN_MEMBERS} (or more), or optimise without --robust.")
    g, jax_g = member_predictor(fit, size, tokens, a_v, unique_m)
    stat = _statistic(q)
    rng = np.random.default_rng(seed)
    m = len(domains)
    base = {n: np.array([float(w.get(d, 0.0)) for d in domains]) for n, w in (baselines or {}).items()}
    extra = [np.full((1, m), 1.0 / m), np.eye(m), *(v[None] for v in base.values())]
    if point_w is not None:
        extra.append(np.asarray(point_w)[None])
    cand = project(np.concatenate([rng.dirichlet(np.ones(m), size=candidates), *extra]), lo_m, hi_m)
    vals_bk = g(cand)
    vals_bk = np.where(np.isfinite(vals_bk), vals_bk, np.inf)
    score_k = stat(vals_bk)
    if jax_g is not None:
        pick_vg, member_vg = _value_grads(jax_g, q)
        w0 = cand[np.argsort(score_k)[:max(1, starts)]]
        w_s, v_s = _pgd(pick_vg, w0, lo_m, hi_m, steps)
        members_w, _ = _pgd(member_vg, cand[np.argmin(vals_bk, axis=1)], lo_m, hi_m, steps)
        method = f"{candidates} candidates, then {steps} projected-gradient steps (jax gradients)"
    else:
        w_s, v_s = cand[np.argsort(score_k)[:1]], np.sort(score_k)[:1]
        members_w = cand[np.argmin(vals_bk, axis=1)]
        method = f"{candidates} candidates only (the law is not written in jax)"
    pick = project(w_s[int(np.argmin(v_s))], lo_m, hi_m)[0]
    check_feasible(pick, lo_m, hi_m)
    names = list(base)
    small_bk = g(np.stack([pick, *(base[n] for n in names)]))  # one call: the pick and every baseline
    at_pick_b = small_bk[:, 0]
    lo_q, hi_q = (1 - interval) / 2, (1 + interval) / 2
    dist = tv(members_w, pick)
    caps = dict(binding or {})
    corner = {b: c for b in range(n_members) if (c := corners(members_w[b], lo_m, hi_m, domains, caps))}
    odds = {}
    for i, name in enumerate(names):
        diff = at_pick_b - small_bk[:, i + 1]
        odds[name] = {"weights": dict(zip(domains, base[name].tolist())), "p_beats": float(np.mean(diff < 0)),
                      "median": float(np.median(diff)), "lo": float(np.quantile(diff, lo_q)),
                      "hi": float(np.quantile(diff, hi_q)), "mean_pred": float(small_bk[:, i + 1].mean()),
                      "pred_lo": float(np.quantile(small_bk[:, i + 1], lo_q)),
                      "pred_hi": float(np.quantile(small_bk[:, i + 1], hi_q))}
    out: dict[str, Any] = {
        "robust": robust or "mean", "weights": dict(zip(domains, pick.tolist())), "members": n_members,
        "value": float(stat(at_pick_b[:, None])[0]),
        "predicted": {"mean": float(at_pick_b.mean()), "lo": float(np.quantile(at_pick_b, lo_q)),
                      "hi": float(np.quantile(at_pick_b, hi_q))},
        "agreement": {"tv": AGREE_TV, "share": float(np.mean(dist <= AGREE_TV)),
                      "median_tv": float(np.median(dist))},
        "odds": odds, "interval": interval,
        "pick_corners": corners(pick, lo_m, hi_m, domains, caps),
        "corner_members": {str(b): c for b, c in corner.items()},
        "member_optima": [dict(zip(domains, w.tolist())) for w in members_w],
        "method": method,
    }
    if point_w is not None:
        out["point_tv"] = float(tv(pick[None], point_w)[0])
    out["warnings"] = robust_warnings(out)
    return out


def robust_warnings(r: Mapping[str, Any]) -> list[str]:
    """The report's warnings: few members; members whose own optimum sits on a corner."""
    out = []
    if r["members"] < MIN_MEMBERS:
        out.append(f"only {r['members']} bootstrap members (at least {MIN_MEMBERS} advised): refit with --bootstrap "
                   f"{MIN_MEMBERS} for odds worth quoting.")
    corner = r["corner_members"]
    if corner:
        by_kind: dict[str, list[str]] = {}
        for b, c in corner.items():
            by_kind.setdefault("; ".join(c), []).append(b)
        def names(bs):
            return ", ".join(bs) if len(bs) <= 12 else f"{', '.join(bs[:10])}, ... ({len(bs)} members)"

        parts = [f"{names(bs)} ({kind})" for kind, bs in sorted(by_kind.items(), key=lambda kv: -len(kv[1]))]
        out.append(f"{len(corner)} of {r['members']} members' own optimum sits on a corner: members " + "; ".join(parts))
    return out


def format_robust(r: Mapping[str, Any]) -> list[str]:
    """Printable lines of the robust pick's report."""
    w = ", ".join(f"{d} {v:.3f}" for d, v in r["weights"].items())
    p = r["predicted"]
    iv = f"{r['interval']:.0%}"
    lines = [f"robust pick ({r['robust']} over {r['members']} bootstrap members): {w}",
             f"  predicted objective {p['mean']:.4f} (members' {iv} interval [{p['lo']:.4f}, {p['hi']:.4f}])",
             f"  {r['agreement']['share']:.0%} of members' own optima lie within {r['agreement']['tv']:g} total "
             f"variation of it (median distance {r['agreement']['median_tv']:.3f})"]
    if r.get("pick_corners"):
        lines.append(f"  the pick itself sits on a corner: {', '.join(r['pick_corners'])}")
    for name, o in r["odds"].items():
        lines.append(f"  vs {name}: beats it in {o['p_beats']:.0%} of members; pick minus {name} {o['median']:+.4f} "
                     f"(median; {iv} [{o['lo']:+.4f}, {o['hi']:+.4f}])")
    lines += [f"  warning: {x}" for x in r["warnings"]]
    return lines
