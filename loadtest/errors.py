"""Typed errors of the load generator: bad flags or a method that cannot be resolved."""


class LoadTestError(Exception):
    """A load test that cannot start: unknown method, malformed -d data, contradictory flags."""
