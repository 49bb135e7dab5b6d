"""Loopback port allocation for the local stacks the tests and the demo start.

Why it exists: "bind to port 0, read the port, close" hands the same port to two callers that ask before
either server binds (the demo's controller and Prometheus once got the same port), and the port comes from
the kernel's ephemeral range, where any outgoing connection may take it before the server binds. Ports here
are handed out once per process, chosen at random from below the ephemeral range, and checked bindable.
It imports nothing from gpuwarden, so the standalone test-bed harness can use it too.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_LOCK = threading.Lock()
_GIVEN: set[int] = set()
_LOWEST = 20000


def _ephemeral_start() -> int:
    try:
        first = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
        return int(first)
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that is bindable now, never handed out before by this process."""
    high = max(_LOWEST + 1000, _ephemeral_start())
    with _LOCK:
        for _ in range(200):
            port = random.randrange(_LOWEST, high)
            if port not in _GIVEN and _bindable(host, port):
                _GIVEN.add(port)
                return port
    raise RuntimeError(f"no free port on {host} in [{_LOWEST}, {high})")
