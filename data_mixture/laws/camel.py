"""``camel``: a capacity-aware mixture law, designed from the claims of CAMEL (arXiv 2603.08022).

Only the abstract of CAMEL is available; its claims: validation loss arises from a nonlinear
interplay of model size and mixture, so the value of a training domain depends on capacity and
the optimal mixture moves with scale (summaries: larger models want more knowledge-heavy data,
less math and code). The form chosen here, per validation domain v (subscript v dropped):

    L(N, D, r) = E + A n^-alpha + B (d * S(r, N))^-beta,      n = N / n_ref,  d = D / d_ref
    S(r, N)    = sum_j exp(t_j + s_j log n) r_j^rho           (t_1 = 0)

* S is the *effective-data multiplier* of the mixture: D tokens of mixture r are worth D * S
  tokens of the reference (domain 1 at N = n_ref). Tokens enter only through d * S, so at a
  fixed mixture the law is a Chinchilla-type law E + A n^-alpha + B' d^-beta with a
  size-dependent data efficiency B' = B S(r, N)^-beta.
* t_j: log value of training domain j at the reference size (t_1 = 0 fixes the scale of S
  against B, which is otherwise unidentifiable).
* s_j in [0, 2]: capacity sensitivity of domain j: its value grows as n^{s_j}. With s_j >= 0,
  S never decreases with N, so the loss is non-increasing in N and D (a sound scaling law at
  every mixture), and larger models are at least as data-efficient. Different s_j make the
  optimum move: at fixed N the best mixture maximises S, r_j proportional to
  (exp(t_j) n^{s_j})^{1/(1-rho)}, so domains with larger s_j gain share as N grows
  (knowledge-heavy data would have the large s_j).
* rho in [0.05, 1]: diminishing returns of a domain's share (rho < 1: interior optimum,
  rho = 1: all weight on the single best domain).
* E >= 0, A, B > 0, alpha, beta in [0, 3] as in Chinchilla.

Parameters per validation domain: 6 + (M - 1) + M = 2M + 5 (O(M); no parameter per pair of
domains). Validation domains are fitted independently (a shared-s joint fit across validation
domains would cut this to M + 5 per domain plus M shared; not done here).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from data_mixture.fitting import Param, ParamSpec
from data_mixture.laws.parametric import ParametricLaw


def log_effective_data(x, data):
    """log S(r, N) (R,) = logsumexp_j (t_j + s_j log n + rho log r_j) over r_j > 0.

    S depends on (mixture, size) only, not on tokens: when ``data`` carries the distinct
    (mixture, size) pairs (``u_mix``, ``u_logn``, from :meth:`CamelLaw.features`) and each row's
    pair (``u_index``), S is computed once per pair and gathered (a run's checkpoints share it:
    5x fewer exponentials on a table with 5 checkpoints per run). Same value either way.
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


class CamelLaw(ParametricLaw):
    name = "camel"
    mixture_moves_with_scale = True

    def spec(self, m: int) -> ParamSpec:
        return ParamSpec(
            [
                Param("E", (), 0.0, 20.0, (0.1, 3.0), doc="irreducible loss"),
                Param("A", (), 1e-8, 1e4, (0.05, 3.0), log=True, doc="size coefficient at N = n_ref"),
                Param("alpha", (), 0.0, 3.0, (0.05, 1.0), doc="size exponent"),
                Param("B", (), 1e-8, 1e4, (0.05, 3.0), log=True, doc="token coefficient at effective D = d_ref"),
                Param("beta", (), 0.0, 3.0, (0.05, 1.0), doc="token exponent"),
                Param("rho", (), 0.05, 1.0, (0.2, 1.0), doc="diminishing returns of a domain's share"),
                Param("t", (m - 1,), -10.0, 10.0, (-1.0, 1.0), doc="log value of domains 2..M at n_ref (domain 1: 0)"),
                Param("s", (m,), 0.0, 2.0, (0.0, 0.5), doc="capacity sensitivity of each training domain"),
            ]
        )

    def features(self, size_r, tokens_r, mix_rm, info):
        data = super().features(size_r, tokens_r, mix_rm, info)
        key = np.concatenate([data["mix"], data["logn"][:, None]], axis=1)
        uniq, inv = np.unique(key, axis=0, return_inverse=True)
        data.update(u_mix=uniq[:, :-1], u_logn=uniq[:, -1], u_index=inv.reshape(-1).astype(np.int32))
        return data

    @staticmethod
    def log_loss(x, data):
        log_s = log_effective_data(x, data)
        loss = x["E"] + x["A"] * jnp.exp(-x["alpha"] * data["logn"]) + x["B"] * jnp.exp(-x["beta"] * (data["logd"] + log_s))
        return jnp.log(loss)
