"""Training: optimizer, sharded state, jitted step, metrics, checkpoints, and the loop."""
