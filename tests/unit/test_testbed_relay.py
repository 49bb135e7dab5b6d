"""The test bed's TCP relay copies both directions and closes cleanly (harness/testbed/relay.py)."""

from __future__ import annotations

import socket
import socketserver
import threading

from harness.testbed.relay import Relay


class _Upper(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            self.wfile.write(line.upper())


def test_relay_forwards_both_ways_and_half_closes() -> None:
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Upper) as upstream:
        threading.Thread(target=upstream.serve_forever, daemon=True).start()
        try:
            with Relay("127.0.0.1", upstream.server_address[1]) as relay:
                assert relay.url == f"http://127.0.0.1:{relay.port}"
                with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as conn:
                    conn.sendall(b"hello\nrelay\n")
                    conn.shutdown(socket.SHUT_WR)
                    received = b""
                    while chunk := conn.recv(1024):
                        received += chunk
                assert received == b"HELLO\nRELAY\n"
        finally:
            upstream.shutdown()
