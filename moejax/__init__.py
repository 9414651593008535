"""moejax: Mixture-of-Experts pretraining in JAX, with data-mixture science built in."""
