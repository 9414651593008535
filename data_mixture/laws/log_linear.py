"""``log_linear``: Olmix's default regression, log-linear in the mixture weights (Chen et al. 2026, arXiv 2602.12237).

    L(r) = c + exp(sum_j t_j r_j)

Parameters (M + 1 for M training domains): c in [0, 20] (the loss no mixture removes) and
t_j in [-20, 20] (the log of what domain j alone leaves above c: r = e_j gives L = c + exp(t_j)).
No separate scale: the rows lie on the simplex, so a common shift of t is a factor on the exponential.

What was read: Olmix's README and fit configs (``regression: type: log_linear``, "default,
parametric scaling law") and its code at commit 218dbc77 (``olmix/fit/utils.py``:
``mixing_law`` = ``exp(log_c) + exp(x @ t)``, fitted per metric by torch L-BFGS on a Huber loss of
raw residuals, delta 0.02, from 300 starts). The form is also the data mixing law of Ye et al.
2024 at one model size (``mixing_law``'s stage 2 writes it with t_1 = 0 and a scale k).

Our fit, written for this package: the house objective (``data_mixture.solver``: Huber on log
residuals, multi-start vmapped L-BFGS, scipy polish) with delta = 0.02 -- Olmix's delta, here on
the relative error instead of the BPB difference (the same for a loss near 1) -- and, besides the
random starts, the least-squares starts of :meth:`LogLinearLaw.extra_starts`.

Model size and tokens do not enter: the law describes one proxy size (Olmix fits it at one),
so ``min_sizes() == 1`` and its best mixture cannot move with scale. Predictions at other sizes
warn (``base.warn_size_extrapolation``) and are the fitted size's.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from data_mixture.laws.parametric import ParametricLaw
from data_mixture.solver import Param, ParamSpec

OLMIX_DELTA = 0.02  # Olmix's Huber delta (LogLinearRegressor.fit), on relative residuals here
FLOOR_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 0.9)  # least-squares starts: c at these fractions of the smallest loss


class LogLinearLaw(ParametricLaw):
    name = "log_linear"
    mixture_moves_with_scale = False
    token_params = ()
    token_exponent = None
    delta = OLMIX_DELTA

    def spec(self, m: int) -> ParamSpec:
        return ParamSpec(
            [
                Param("c", (), 0.0, 20.0, (0.0, 2.0), doc="loss no mixture removes"),
                Param("t", (m,), -20.0, 20.0, (-1.0, 1.0), doc="log of what each training domain alone leaves above c"),
            ]
        )

    def min_sizes(self) -> int:
        return 1

    def extra_starts(self, spec, data, y, wts):
        """For c = f x min(L), f in :data:`FLOOR_FRACTIONS`: t by weighted least squares of
        log(L - c) on the mixture (exact where the law holds and the residuals are small).
        Only the free entries are returned (fixed ones are taken from the spec)."""
        loss, mix = np.exp(y), np.asarray(data["mix"], np.float64)
        sw = np.sqrt(np.asarray(wts, np.float64))
        keep = sw > 0
        out = []
        for f in FLOOR_FRACTIONS:
            c = f * float(loss[keep].min())
            t, *_ = np.linalg.lstsq(mix[keep] * sw[keep, None], np.log(loss[keep] - c) * sw[keep], rcond=None)
            full = np.concatenate([[c], t])
            out.append(full[spec.free_index])
        return np.stack(out)

    @staticmethod
    def log_loss(x, data):
        return jnp.log(x["c"] + jnp.exp(data["mix"] @ x["t"]))
