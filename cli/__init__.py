"""The `ssd` command: composes the engine, the benchmarks, deployment, the load generator and draft training."""
