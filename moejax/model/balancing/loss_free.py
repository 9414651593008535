"""``loss_free``: auxiliary-loss-free balancing with a per-expert selection bias."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from moejax.model.balancing.base import Objective, State, StepStats, hparam, number


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossFreeBias(Objective):
    """Selection bias b_e, added to the router scores for top-k selection only, and after every
    optimizer step

        b_e <- b_e + u * sign(mean_i load_i - load_e)

    with load over the step's global batch (Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing
    Strategy for Mixture-of-Experts", arXiv:2408.15664, Algorithm 1; DeepSeek-V3, arXiv:2412.19437,
    section 2.1.2, where u is the "bias update speed" gamma = 1e-3).

    No loss and no gradient: the bias is state, not a parameter, so the optimizer and weight decay
    never touch it. The combine weights stay the unbiased scores of the chosen experts.
    """

    name = "loss_free"
    u: float = hparam(check=number(0), doc="bias update rate per step (DeepSeek-V3: 1e-3)")

    def check_setup(self) -> None:
        if self.setup.top_k >= self.setup.num_experts:
            self.fail(
                f"needs model.moe.experts_per_token < model.moe.num_experts (got top-{self.setup.top_k} "
                f"of {self.setup.num_experts}): a selection bias cannot change a top-k that takes "
                "every expert. Use a loss-based objective instead, e.g. ('switch', {'weight': 1e-2})."
            )

    def init_state(self) -> State:
        return {"bias_e": jnp.zeros((self.setup.num_experts,), jnp.float32)}

    def selection_bias(self, state: State) -> jax.Array:
        return state["bias_e"]

    def update(self, state: State, stats: StepStats) -> State:
        load_e = stats.load_e.astype(jnp.float32)
        return {"bias_e": state["bias_e"] + self.u * jnp.sign(jnp.mean(load_e) - load_e)}

    def metrics(self, state: State) -> dict[str, jax.Array]:
        return {"bias_norm": jnp.linalg.norm(state["bias_e"])}
