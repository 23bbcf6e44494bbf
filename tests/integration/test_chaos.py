"""Chaos under load through a supervised `ssd serve` (two targets, an n-gram draft): kill -9 the draft, a target,
the gateway while streams run. Streams never hang; those that complete have the greedy text; the supervisor
restarts each component and the stack serves again (bench/chaos.py is the same at a bigger scale)."""

import pytest

from bench.chaos import client, kill_under_load, reference, start_serve, stop_under_load, table

pytestmark = [pytest.mark.model, pytest.mark.slow]

NUM_STREAMS, MAX_TOKENS = 3, 32


def test_kill_each_component_under_load(tmp_path):
    serve = start_serve(tmp_path / "logs", targets=2)
    try:
        expected = reference(client(serve.url), ["Count from one to thirty in words, separated by commas.",
                                                 "Write a haiku about the sea.",
                                                 "List the planets of the solar system."], MAX_TOKENS)
        rows = {kind: kill_under_load(serve, kind, expected, NUM_STREAMS, MAX_TOKENS)
                for kind in ("draft", "target", "gateway")}
        code, drained = stop_under_load(serve, expected, 2, 16)  # SIGTERM while 2 short streams run
    finally:
        serve.stop()
    print(table(list(rows.values())))  # noqa: T201 - the chaos table, shown with -s
    assert all(r.num_lost == 0 and r.num_different == 0 for r in rows.values()), rows
    assert rows["draft"].num_identical == NUM_STREAMS  # a dead draft fails no request
    assert all(r.restart_s is not None and r.recovery_s is not None for r in rows.values()), rows
    assert code == 0  # SIGTERM: drained, then stopped
    for prompt, r in zip(list(expected)[:2], drained, strict=True):  # 16 of the reference's 32 greedy tokens
        assert r.error is None and r.text and expected[prompt].startswith(r.text), (prompt, r)
    log = (tmp_path / "logs" / "serve.out").read_text()
    assert log.count("service exited; restarting it") == 3 and log.count("restarted") >= 3
