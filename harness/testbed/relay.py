"""A TCP relay from the node IP to a loopback-only server, so pods on the real node can reach it.

The harness's servers (Prometheus above all) bind 127.0.0.1 only; pods on the real node reach the host at
the node IP through the CNI bridge, never its loopback. A :class:`Relay` listens on ``<node ip>:<free port>``
and copies bytes both ways to ``127.0.0.1:<port>``: the loopback server stays as it is, and only this one
port is exposed, for as long as the test needs it.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from types import TracebackType

from gpuwarden import ports


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    target: tuple[str, int]


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        assert isinstance(self.server, _Server)
        client: socket.socket = self.request
        with socket.create_connection(self.server.target, timeout=10) as upstream:
            upstream.settimeout(None)
            back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
            back.start()
            _pipe(client, upstream)
            back.join(timeout=30)


class Relay:
    """``with Relay(node_ip, 9090) as relay: relay.url`` (``http://<node ip>:<port>``)."""

    def __init__(self, listen_host: str, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.host = listen_host
        self.port = ports.free_port(listen_host)
        self._server = _Server((listen_host, self.port), _Handler, bind_and_activate=True)
        self._server.target = (target_host, target_port)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Relay:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
