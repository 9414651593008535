"""``camel``: a capacity-aware mixture law, designed from what is readable of CAMEL (arXiv 2603.08022).

What was read: the abstract and the opening paragraph of the introduction of the HTML version
(arxiv.org/html/2603.08022v1; the rest of the paper, including its formula, was not reachable).
They say: CAMEL "models validation loss with the nonlinear interplay between model size and
mixture"; existing mixture scaling laws "fail to extrapolate well to large model sizes"; the law
is fitted on MoE models up to 7B-A150M and its optimal mixture is verified on a 55B-A1.2B target;
the setting is mid-training (a model continues on a mixture of domains such as general knowledge,
code, math and multilingual content). Nothing here is CAMEL's own formula: the form below is our
choice, and only its premise (the value of a domain depends on model capacity, so the best
mixture may move with size) comes from the paper. Per validation domain (subscript dropped):

    L(N, D, r) = E + A n^-alpha + B (d S(r, N))^-beta + 1 / F(r)        n = N / n_ref, d = D / d_ref
    S(r, N)    = sum_j exp(t_j + s_j log n) r_j^rho                      (t_1 = 0)
    F(r)       = sum_j C_j r_j^gamma_j

* S is the *effective-data multiplier* (our choice): D tokens of mixture r are worth D * S
  tokens of the reference (domain 1 at N = n_ref). t_j is domain j's log value at n_ref (t_1 = 0:
  a common shift of t is absorbed by B); rho in [0.05, 1] gives diminishing returns of a share.
* s_j in [0, 1] is domain j's capacity sensitivity: its value grows as n^{s_j}. s_j >= 0 keeps
  the loss non-increasing in N and D; s_j <= 1 says that a domain's effective data cannot grow
  faster than the model itself (a bound, and a prior against extrapolating a steep trend fitted
  on a 10x ladder another 10x: with s_j up to 2 the fits used the extra room to chase noise).
* 1 / F(r) is a *mixture-dependent floor* (the mixture term of Shukor et al.'s additive law,
  arXiv 2507.09404): what a mixture cannot teach the validation domain however large the model.
  It does not move with size. C_j > 0, gamma_j in [0.01, 3].
* E >= 0, A, B > 0, alpha, beta in [0, 3] as in Chinchilla.

The form nests both earlier laws: with C_j -> inf it is the first ``camel`` (capacity in the data
term only); with rho = 1, t = 0, s = 0 (S = 1) it is ``additive``. The mixture thus acts in two
ways with different scaling: through data efficiency, which shrinks with d and moves with n, and
through a floor that stays. At fixed N and D the best mixture trades both off, and it moves with
N whenever the s_j differ (``mixture_moves_with_scale = True``). Fitting adds data-driven starts
in both nested corners (:meth:`CamelLaw.extra_starts`) to the random ones.

Parameters per validation domain: 6 + (M - 1) + 3M = 4M + 5 (O(M), no parameter per pair of
domains). Validation domains are fitted independently. A fit saved by the first ``camel`` (no
``C``, ``gamma``) still loads and predicts as it did: its floor term is off.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from data_mixture.laws.parametric import ParametricLaw, safe_pow
from data_mixture.solver import Param, ParamSpec, starts_rng

CORNER_STARTS = 8  # extra starts: half in the additive corner (S = 1), half in the first camel's (floor off)
FLOOR_OFF = 1e4  # C_j of a start whose floor term 1 / F is negligible (<= 1e-4 / (min_j r_j^gamma_j))


def log_effective_data(x, data):
    """log S(r, N) (R,) = logsumexp_j (t_j + s_j log n + rho log r_j) over r_j > 0.

    S depends on (mixture, size) only, not on tokens: when ``data`` carries the distinct
    (mixture, size) pairs (``u_mix``, ``u_logn``, from :meth:`CamelLaw.features`) and each row's
    pair (``u_index``), S is computed once per pair and gathered (a run's checkpoints share it).
    Same value either way.
    """
    if "u_index" in data:
        return _log_s(x, data["u_mix"], data["u_logn"])[data["u_index"]]
    return _log_s(x, data["mix"], data["logn"])


def _log_s(x, r, logn):
    t = jnp.concatenate([jnp.zeros((1,), x["s"].dtype), x["t"]])
    pos = r > 0
    logr = jnp.log(jnp.where(pos, r, 1.0))
    a = t[None, :] + x["s"][None, :] * logn[:, None] + x["rho"] * logr
    return logsumexp(jnp.where(pos, a, -1e30), axis=-1)


def mixture_floor(x, mix):
    """1 / F(r) (R,), F(r) = sum_j C_j r_j^gamma_j (r_j = 0 contributes nothing). Parameters
    without ``C`` (a fit saved by the first ``camel``, which had no floor term) give 0."""
    if "C" not in x:
        return jnp.zeros(mix.shape[:-1], mix.dtype)
    return 1.0 / jnp.maximum(jnp.sum(x["C"] * safe_pow(mix, x["gamma"]), axis=-1), 1e-30)


class CamelLaw(ParametricLaw):
    name = "camel"
    mixture_moves_with_scale = True

    def spec(self, m: int) -> ParamSpec:
        return ParamSpec(
            [
                Param("E", (), 0.0, 20.0, (0.1, 3.0), doc="irreducible loss (mixture-independent part)"),
                Param("A", (), 1e-8, 1e4, (0.05, 3.0), log=True, doc="size coefficient at N = n_ref"),
                Param("alpha", (), 0.0, 3.0, (0.05, 1.0), doc="size exponent"),
                Param("B", (), 1e-8, 1e4, (0.05, 3.0), log=True, doc="token coefficient at effective D = d_ref"),
                Param("beta", (), 0.0, 3.0, (0.05, 1.0), doc="token exponent"),
                Param("rho", (), 0.05, 1.0, (0.2, 1.0), doc="diminishing returns of a domain's share of the data"),
                Param("t", (m - 1,), -10.0, 10.0, (-1.0, 1.0), doc="log data value of domains 2..M at n_ref (domain 1: 0)"),
                Param("s", (m,), 0.0, 1.0, (0.0, 0.5), doc="capacity sensitivity of each domain's data value"),
                Param("C", (m,), 1e-6, 1e6, (0.3, 30.0), log=True, doc="floor term: value of each training domain"),
                Param("gamma", (m,), 0.01, 3.0, (0.1, 1.5), doc="floor term: returns exponent of each training domain"),
            ]
        )

    def features(self, size_r, tokens_r, mix_rm, info):
        data = super().features(size_r, tokens_r, mix_rm, info)
        key = np.concatenate([data["mix"], data["logn"][:, None]], axis=1)
        uniq, inv = np.unique(key, axis=0, return_inverse=True)
        data.update(u_mix=uniq[:, :-1], u_logn=uniq[:, -1], u_index=inv.reshape(-1).astype(np.int32))
        return data

    def extra_starts(self, spec, data, y, wts):
        """:data:`CORNER_STARTS` random starts moved into the two nested laws' corners: even ones
        with S = 1 (rho = 1, t = 0, s = 0: the additive law), odd ones with the floor term off
        (C_j = :data:`FLOOR_OFF`: the first camel). Deterministic (fixed seed)."""
        m = data["mix"].shape[1]
        out = []
        for k, w in enumerate(spec.sample(starts_rng(0, 31, m), CORNER_STARTS)):
            x = spec.unpack(w)
            if k % 2 == 0:
                x.update(rho=1.0, t=np.zeros(m - 1), s=np.zeros(m))
            else:
                x.update(C=np.full(m, FLOOR_OFF))
            out.append(spec.pack(x))
        return np.stack(out)

    @staticmethod
    def log_loss(x, data):
        log_s = log_effective_data(x, data)
        loss = (
            x["E"]
            + x["A"] * jnp.exp(-x["alpha"] * data["logn"])
            + x["B"] * jnp.exp(-x["beta"] * (data["logd"] + log_s))
            + mixture_floor(x, data["mix"])
        )
        return jnp.log(loss)
