"""``phi``: phi-balancing, a price on an EMA of the population routing, applied as a balance loss,
as a top-k selection bias, or both."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from moejax.model.balancing.base import (
    BalancingError, Check, Objective, State, StepStats, is_real, hparam, mean_probs, number, one_of,
)
from moejax.model.router import Routing

POTENTIALS = ("neg_entropy", "sq_l2", "tsallis")
APPLY = ("loss", "bias", "both")
EMA_OF = ("probs", "loads")
BIAS_FORMS = ("accumulate", "price")


def price(potential: str, m_e: jax.Array, tsallis_q: float = 1.5) -> jax.Array:
    """q = grad phi(m) for a routing distribution m (float32 [E], sums to 1).

    Each potential phi is convex and symmetric, and scaled so that its curvature at the uniform
    m = 1/E is E, like the negative entropy's (1/m): the same alpha pushes equally hard near
    balance, whatever the potential.

    - ``neg_entropy``: phi(m) = sum m log m,                       q = log m + 1
    - ``sq_l2``:       phi(m) = E/2 sum m^2,                       q = E m
    - ``tsallis``:     phi(m) = sum (E m)^s / (E s (s - 1)),       q = (E m)^(s-1) / (s - 1)
      (s = ``tsallis_q``; s -> 1 recovers neg_entropy up to a constant, s = 2 is sq_l2 up to one)

    Constants in q do not matter: the loss multiplies q by a distribution that sums to 1, and a
    constant added to every router score does not change the top-k.
    """
    e = m_e.shape[-1]
    m_e = jnp.maximum(m_e.astype(jnp.float32), jnp.finfo(jnp.float32).tiny)
    if potential == "neg_entropy":
        return jnp.log(m_e) + 1.0
    if potential == "sq_l2":
        return e * m_e
    if potential == "tsallis":
        return (e * m_e) ** (tsallis_q - 1.0) / (tsallis_q - 1.0)
    raise ValueError(f"unknown potential {potential!r}; choose one of {POTENTIALS}")


def positive_or_none() -> Check:
    return Check(lambda x: x is None or (is_real(x) and x > 0), "a number > 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PhiBalancing(Objective):
    """phi-balancing (Chen, Li, et al. 2026, "phi-Balancing for Mixture-of-Experts Training",
    arXiv:2605.15403): minimise a convex potential phi of the *population* routing distribution
    by online mirror descent instead of penalising noisy mini-batch counts.

    State m_e: an EMA of the global batch's routing, once per optimizer step (m = 1/E at start),

        m <- (1 - eta) m + eta * r,     r = pbar (mean routing probability, ``ema_of='probs'``)
                                          or load (top-k assignment fractions, ``ema_of='loads'``)

    and the price q = grad phi(m) of the state *before* the step, which acts in one or both ways
    (``apply``):

    - ``loss``: L = alpha * sum_e stop_grad(q_e - mean(q)) * pbar_e(micro-batch). Centring q
      changes no gradient (sum_e pbar_e = 1) and makes L read 0 at uniform routing. q is a
      constant of the step and L is linear in pbar, so summing micro-batch gradients gives
      exactly the global-batch gradient.
    - ``bias``: a selection bias b_e added to the router scores for top-k *selection only* (like
      ``loss_free``'s bias): the combine weights stay the unbiased scores, no gradient flows, and
      the optimizer never sees b (it is state, not a parameter). ``bias_form``:
      ``accumulate`` (default): b <- b - gamma * (q' - mean(q')) after every step, q' the price of
      the updated m (b starts at 0); ``price``: b = -gamma * (q - mean(q)), recomputed from m.
    - ``both``: the loss and the bias, from the same m.

    Derivation (docs/balancing.md, "phi as a routing adjustment"). The routing x (top-k
    assignments, relaxed to their polytope) is the primal variable, F(x) = -sum_t <s_t, x_t> the
    router's own preference (scores s), E[x] the population load.

    ``price``, the penalised problem min_x F(x) + gamma phi(m) s.t. m = E[x]. Its Lagrangian
    L(x, m, q) = F(x) + gamma phi(m) + gamma <q, E[x] - m> gives, for fixed q, the best routing
    top-k of s_t - gamma q (the bias -gamma q; its mean moves no top-k), and, minimised over m,
    the dual g(q) = min_x [F(x) + gamma <q, E[x]>] - gamma phi*(q) with gradient
    gamma (E[x*(q)] - grad phi*(q)). Mirror ascent on g with mirror map phi* and step eta reads
    grad phi*(q') = (1 - eta) grad phi*(q) + eta E[x*(q)]; as grad phi* = (grad phi)^-1 and
    m = grad phi*(q), that is exactly the EMA m <- (1 - eta) m + eta * load, q' = grad phi(m'):
    the EMA is the accumulated dual variable (in phi*'s coordinates) and eta its step. But this
    solves the *penalised* problem: under a persistent preference it keeps an imbalance that
    only shrinks as gamma grows (a proportional controller), and a large gamma with a fast EMA
    overshoots (the selection flips between experts).

    ``accumulate``, the constrained problem min_x F(x) s.t. E[x] = 1/E. Lagrangian
    F(x) + <lambda, E[x] - 1/E>; best routing: top-k of s_t - lambda (bias b = -lambda); dual
    ascent on lambda with the violation measured in phi's mirror coordinates,
    lambda <- lambda + gamma (grad phi(m) - grad phi(1/E)), m the EMA estimate of E[x] from above
    (grad phi(1/E) is a constant vector; the mean of q stands in for it, as constants move no
    top-k). It stops only where grad phi(m) is constant, i.e. m uniform: an integral controller
    that drives a persistent skew to balance (tests/test_balancing_phi_bias.py). With ``sq_l2``
    it is plain dual ascent on the smoothed violation; ``loss_free`` is the same scheme with
    sign(load - mean) of the last step in place of the price of the EMA.

    Both dual gradients are the loads E[x] of the routing the bias acts on: ``ema_of=None``
    picks 'loads' when there is a bias and 'probs' for the loss alone (whose gradient flows
    through the soft probabilities). Cost: one or two [E] vectors per layer.
    """

    name = "phi"
    alpha: float | None = hparam(None, check=positive_or_none(), doc="loss weight")
    gamma: float | None = hparam(
        None, check=positive_or_none(), doc="selection-bias scale, in router-score units (apply='bias' or 'both')"
    )
    apply: str = hparam("loss", check=one_of(*APPLY), doc="how the price acts: balance loss, selection bias, or both")
    ema_of: str | None = hparam(
        None,
        check=Check(lambda x: x is None or x in EMA_OF,
                    "'probs' | 'loads', or None ('loads' with a bias, 'probs' for apply='loss')"),
        doc="what the EMA m tracks: mean routing probabilities or top-k loads",
    )
    bias_form: str = hparam(
        "accumulate", check=one_of(*BIAS_FORMS),
        doc="'accumulate': b accumulates -gamma (q - mean q) every step; 'price': b = -gamma (q - mean q)",
    )
    eta: float = hparam(0.65, check=number(0, 1), doc="EMA rate of m (paper: about 0.6-0.7)")
    potential: str = hparam("neg_entropy", check=one_of(*POTENTIALS), doc="the potential phi")
    tsallis_q: float = hparam(
        1.5,
        check=Check(lambda s: is_real(s) and s > 0 and s != 1, "a number > 0 other than 1 (1 is 'neg_entropy')"),
        doc="exponent of the Tsallis potential (only with potential='tsallis')",
    )

    @property
    def uses_loss(self) -> bool:
        return self.apply in ("loss", "both")

    @property
    def uses_bias(self) -> bool:
        return self.apply in ("bias", "both")

    @property
    def tracks(self) -> str:
        """What m tracks: ``ema_of``, or by default the quantity the price acts on."""
        if self.ema_of is not None:
            return self.ema_of
        return "loads" if self.uses_bias else "probs"

    def check_setup(self) -> None:
        for key, needed, doc in (("alpha", self.uses_loss, "loss weight"),
                                 ("gamma", self.uses_bias, "selection-bias scale, in router-score units")):
            value = getattr(self, key)
            if needed and value is None:
                raise BalancingError(
                    f"balancing objective 'phi' needs hyperparameter {key!r} ({doc}; allowed: a number > 0) "
                    f"with apply={self.apply!r}, e.g. ('phi', {{{key!r}: ..., 'apply': {self.apply!r}}})."
                )
            if not needed and value is not None:
                self.fail(
                    f"hyperparameter {key!r} has value {value!r} but does nothing with apply={self.apply!r}; "
                    f"drop it, or use apply='both' (allowed apply: {' | '.join(repr(a) for a in APPLY)})."
                )
        if not self.uses_bias and self.bias_form != "accumulate":
            self.fail(
                f"hyperparameter 'bias_form' has value {self.bias_form!r} but does nothing with "
                f"apply={self.apply!r}; drop it, or use apply='bias' or 'both'."
            )
        if self.uses_bias and self.setup.top_k >= self.setup.num_experts:
            self.fail(
                f"apply={self.apply!r} needs model.moe.experts_per_token < model.moe.num_experts (got "
                f"top-{self.setup.top_k} of {self.setup.num_experts}): a selection bias cannot change a "
                "top-k that takes every expert. Use apply='loss'."
            )

    @property
    def accumulates(self) -> bool:
        return self.uses_bias and self.bias_form == "accumulate"

    def init_state(self) -> State:
        e = self.setup.num_experts
        state = {"m_e": jnp.full((e,), 1.0 / e, jnp.float32)}
        if self.accumulates:
            state["bias_e"] = jnp.zeros((e,), jnp.float32)
        return state

    def centred_price(self, state: State) -> jax.Array:
        q_e = jax.lax.stop_gradient(price(self.potential, state["m_e"], self.tsallis_q))
        return q_e - jnp.mean(q_e)

    def selection_bias(self, state: State) -> jax.Array | None:
        if not self.uses_bias:
            return None
        if self.accumulates:
            return state["bias_e"]
        return -self.gamma * self.centred_price(state)

    def loss(self, routing: Routing, state: State) -> jax.Array:
        if not self.uses_loss:
            return jnp.zeros((), jnp.float32)
        # Centred: the value reads 0 at uniform routing; no gradient changes, as sum_e pbar_e = 1.
        return self.alpha * jnp.sum(self.centred_price(state) * mean_probs(routing))

    def update(self, state: State, stats: StepStats) -> State:
        r_e = (stats.load_e if self.tracks == "loads" else stats.pbar_e).astype(jnp.float32)
        new = {"m_e": (1.0 - self.eta) * state["m_e"] + self.eta * r_e}
        if self.accumulates:
            new["bias_e"] = state["bias_e"] - self.gamma * self.centred_price(new)
        return new

    def metrics(self, state: State) -> dict[str, jax.Array]:
        m_e = state["m_e"]
        out = {"ema_max_vio": m_e.shape[-1] * jnp.max(m_e) - 1.0}
        if self.uses_bias:
            out["bias_norm"] = jnp.linalg.norm(self.selection_bias(state))
        return out
