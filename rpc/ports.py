"""Free localhost ports for services a launcher starts (stacks, benchmarks, tests).

A port found free now is only bound later, by a child, after its start-up. In between, any socket bound to
port 0 (the tensor-parallel TCPStore, gloo's pairs, another child's listener) gets a port from the kernel's
ephemeral range, and so may take ours: the child then fails at start-up with "address already in use". So
the ports handed out here come from just below that range, where the kernel never assigns one by itself,
chosen at random (other processes pick too) and never twice by one process.
"""

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default when the file cannot be read
BAND_WIDTH = 16384  # the ports below the ephemeral range that we choose from
LOWEST_PORT = 1024  # never a privileged port
MAX_TRIES = 200

_handed_out: set[int] = set()
_choose = random.SystemRandom()  # independent of any seed a caller set


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def _is_free(port: int) -> bool:
    """True when a listener could bind 127.0.0.1:port now (SO_REUSEADDR, as the services bind)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port() -> int:
    """A localhost TCP port nothing listens on now, below the kernel's ephemeral range and not handed out
    before by this process. Falls back to a kernel-assigned port when no such band exists (a system whose
    ephemeral range starts under 2048) or none of MAX_TRIES random ports in it is free."""
    high = _ephemeral_low() - 1
    low = max(LOWEST_PORT, high - BAND_WIDTH)
    if high - low >= LOWEST_PORT:
        for _ in range(MAX_TRIES):
            port = _choose.randint(low, high)
            if port not in _handed_out and _is_free(port):
                _handed_out.add(port)
                return port
    port = _kernel_port()
    _handed_out.add(port)
    return port
