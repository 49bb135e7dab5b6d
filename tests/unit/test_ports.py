"""Port allocation never hands out the same port twice and stays below the ephemeral range."""

from __future__ import annotations

import socket

import pytest

from gpuwarden import ports


def test_ports_are_unique_bindable_and_below_the_ephemeral_range() -> None:
    got = [ports.free_port() for _ in range(50)]
    assert len(set(got)) == len(got)
    start = ports._ephemeral_start()
    assert all(20000 <= p < max(21000, start) for p in got)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", got[-1]))


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = ports.free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", busy))
        held.listen()
        ports._GIVEN.discard(busy)  # forget it: only the bind check can keep it out now
        picks = iter([busy, busy + 1 if busy + 1 < 21000 else busy - 1])
        monkeypatch.setattr(ports.random, "randrange", lambda _lo, _hi: next(picks))
        assert ports.free_port() != busy
