"""Which requests on the extender's port need a client certificate, and the two checks that apply it.

Why: a verb can bind a pod (and filter, prioritize, preempt steer where pods go), so kube-scheduler calls
them with its extender `tlsConfig` client certificate, and a replica forwarding bind to the binder presents
its own (`forward.py`). The kubelet's probes and Prometheus' scrape of `/metrics` share the port and present
none. So the TLS layer asks for a certificate and verifies one that is presented (`ssl.CERT_OPTIONAL`,
gpuwarden/tlscontext.py), and each request is judged here by its path: one port, one Service, one URL in
the scheduler's config, and the probes unchanged. (A second port for the verbs would need a second Service
port, a second scheduler URL to keep in step, and would still carry `/metrics` on the first.)

The decision is pure (`needs_certificate`, `admitted`, table-tested). The checks are thin: aiohttp's
middleware answers 403 to a verb without a verified certificate, and the lean verb path (`fastpath.py`)
takes a connection only when its peer presented one (`lean_admits`): any other connection is aiohttp's
from its first byte, where the middleware judges each request - so neither path answers a verb it must
not. It must not look inside a certificate: the TLS layer verified it against `tls.client_ca_file`, which is
the whole of the trust (no names are checked, as kube-scheduler's certificate carries none we could know).
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import Counter

REFUSED = "a verified client certificate is required for this path"


def needs_certificate(path: str, prefix: str) -> bool:
    """Whether `path` (without its query) is the extender's: the prefix itself or anything below it - the
    four verbs, `bind/forwarded`, and any other path there (a 404 for a caller with a certificate).

    With an empty prefix the verbs sit at the root beside the probes: then only the verbs' own paths."""
    base = "/" + prefix.strip("/") if prefix.strip("/") else ""
    if base:
        return path == base or path.startswith(base + "/")
    return path in {"/filter", "/prioritize", "/preempt", "/bind", "/bind/forwarded"}


def admitted(path: str, prefix: str, *, required: bool, verified: bool) -> bool:
    """Whether a request for `path` is answered: always without `required`; else a path that
    `needs_certificate` only from a peer with a verified client certificate."""
    return not required or verified or not needs_certificate(path, prefix)


def verified_peer(transport: asyncio.BaseTransport | None) -> bool:
    """Whether the connection's peer presented a certificate the TLS layer verified (under
    `ssl.CERT_OPTIONAL` OpenSSL reports a certificate only once it verified it; plain HTTP has none)."""
    return transport is not None and bool(transport.get_extra_info("peercert"))


def certificate_check(prefix: str, refusals: Counter) -> Middleware:
    """aiohttp middleware: 403 for a request `admitted` refuses (counted in `refusals`)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not admitted(request.path, prefix, required=True, verified=verified_peer(request.transport)):
            refusals.inc()
            return web.Response(status=403, text=REFUSED)
        return await handler(request)

    return check


def lean_admits(transport: asyncio.BaseTransport) -> bool:
    """For the lean verb path: serve this connection only if its peer presented a verified certificate."""
    return verified_peer(transport)
