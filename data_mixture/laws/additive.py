"""``additive``: additive scaling law with a mixture term (Shukor et al. 2025, arXiv 2507.09404).

    L(N, D, r) = E + A (N / n_ref)^-alpha + B (D / d_ref)^-beta + 1 / sum_i C_i r_i^gamma_i

Parameters (5 + 2M for M training domains): E >= 0 (irreducible loss), A, B > 0 (size and token
coefficients at the reference scales), alpha, beta in [0, 3] (exponents), C_i > 0 and
gamma_i in [0.01, 3] (value and returns of training domain i; r_i = 0 contributes nothing).

The mixture enters only through its own additive term, so argmin_r L(N, D, r) = argmax_r
sum_i C_i r_i^gamma_i whatever N and D: the best mixture cannot move with scale
(``mixture_moves_with_scale = False``; ``tests/test_dm_laws.py`` checks it on fitted laws).
"""

from __future__ import annotations

import jax.numpy as jnp

from data_mixture.laws.parametric import ParametricLaw, safe_pow
from data_mixture.solver import Param, ParamSpec


class AdditiveLaw(ParametricLaw):
    name = "additive"
    mixture_moves_with_scale = False

    def spec(self, m: int) -> ParamSpec:
        return ParamSpec(
            [
                Param("E", (), 0.0, 20.0, (0.1, 3.0), doc="irreducible loss"),
                Param("A", (), 1e-8, 1e4, (0.05, 3.0), log=True, doc="size coefficient at N = n_ref"),
                Param("alpha", (), 0.0, 3.0, (0.05, 1.0), doc="size exponent"),
                Param("B", (), 1e-8, 1e4, (0.05, 3.0), log=True, doc="token coefficient at D = d_ref"),
                Param("beta", (), 0.0, 3.0, (0.05, 1.0), doc="token exponent"),
                Param("C", (m,), 1e-6, 1e6, (0.3, 30.0), log=True, doc="value of each training domain"),
                Param("gamma", (m,), 0.01, 3.0, (0.1, 1.5), doc="returns exponent of each training domain"),
            ]
        )

    @staticmethod
    def log_loss(x, data):
        s = jnp.sum(x["C"] * safe_pow(data["mix"], x["gamma"]), axis=-1)
        loss = (
            x["E"]
            + x["A"] * jnp.exp(-x["alpha"] * data["logn"])
            + x["B"] * jnp.exp(-x["beta"] * data["logd"])
            + 1.0 / jnp.maximum(s, 1e-30)
        )
        return jnp.log(loss)
