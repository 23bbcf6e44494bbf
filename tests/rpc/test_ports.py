"""rpc/ports.py: ports for children come from below the kernel's ephemeral range, free, never twice."""

import socket

from rpc import ports


def test_ports_are_free_below_the_ephemeral_range_and_never_handed_out_twice():
    low = ports._ephemeral_low()
    seen = [ports.free_port() for _ in range(50)]
    assert len(set(seen)) == len(seen)
    assert all(ports.LOWEST_PORT <= p < low for p in seen)
    for port in seen[:5]:  # free now: a listener can bind it
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_bound_to_zero_elsewhere_is_never_handed_out():
    """The failure this module exists for: a socket bound to port 0 (a tensor-parallel store, gloo) takes a
    kernel-chosen port, which must not be one a child is about to bind."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        assert taken >= ports._ephemeral_low()
        assert all(ports.free_port() != taken for _ in range(50))


def test_a_taken_port_in_the_band_is_skipped(monkeypatch):
    other = ports._kernel_port()  # free now, never handed out
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        held = holder.getsockname()[1]
        choices = iter([held, other])
        monkeypatch.setattr(ports._choose, "randint", lambda lo, hi: next(choices))
        assert ports.free_port() == other


def test_without_a_band_the_kernel_chooses(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: 1500)
    port = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
