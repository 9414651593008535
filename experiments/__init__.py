"""Configs, studies, benchmarks and tools on top of moejax and data_mixture, one folder each
(experiments/README.md)."""
