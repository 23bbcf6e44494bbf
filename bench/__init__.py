"""Benchmarks: datasets, baselines, the `ssd bench` command."""
