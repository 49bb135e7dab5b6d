"""Forwarding bind to the one binder replica (`extender.bind_protocol: leader`).

Why it exists: kube-scheduler reaches the extender through a Service, so any replica may get a bind; with
the leader protocol only the fenced holder of the Lease binds (bind.py). A follower passes the request on,
unchanged, to the URL the holder advertises in the Lease (`gpuwarden.io/extender-url`) at
`<prefix>/bind/forwarded`, and hands the holder's answer back to the scheduler.

What it must not do: forward twice (a replica that gets a forwarded bind and is not the binder answers with
an error, never passes it on: two replicas that each think the other leads would bounce it forever), raise
(every failure is an `Error` the scheduler retries on), or write anything itself: the binder writes the
Binding and its Event.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable

import aiohttp

from controller.extenderv1 import ExtenderBindingArgs, ExtenderBindingResult
from gpuwarden.config.extender import ExtenderConfig

log = logging.getLogger(__name__)

FORWARDED_SUFFIX = "/bind/forwarded"
"""The route a binder serves forwarded binds on, below the extender's path prefix."""


def advertised_url(cfg: ExtenderConfig, environ: dict[str, str] | None = None) -> str:
    """This replica's extender URL for the Lease: `advertise_url`, else from `POD_IP`; "" when neither."""
    if cfg.advertise_url:
        return cfg.advertise_url
    ip = (environ if environ is not None else dict(os.environ)).get("POD_IP", "").strip()
    if not ip:
        return ""
    host = f"[{ip}]" if ":" in ip else ip
    scheme = "https" if cfg.tls.cert_file is not None else "http"
    return f"{scheme}://{host}:{cfg.port}{cfg.path_prefix}"


class Forwarder:
    """Passes a bind to the binder at `binder_url()` ("" when no replica holds the Lease)."""

    def __init__(
        self,
        binder_url: Callable[[], str],
        *,
        own_url: str,
        timeout: float,
        ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        """`ssl_context`: the client context, or where to get the current one on every forward (it follows
        certificate rotation: `tlsport.ExtenderTls.client_context`); None: the system's defaults."""
        self._binder_url = binder_url
        self._own_url = own_url
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        url = self._binder_url()
        pod = f"{args.pod_namespace}/{args.pod_name}"
        if not url:
            return ExtenderBindingResult(
                error=f"no gpuwarden replica is the binder right now (bind of {pod}); retry"
            )
        if url == self._own_url:  # the Lease still names us, but we are not fenced: never loop to ourselves
            return ExtenderBindingResult(error=f"this replica is not the binder (bind of {pod}); retry")
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.post(
                url + FORWARDED_SUFFIX,
                data=args.to_json(),
                headers={"Content-Type": "application/json"},
                ssl=self._client_ssl(),
            ) as response:
                body = await response.read()
                if response.status != 200:
                    text = body.decode("utf-8", "replace")[:200]
                    return ExtenderBindingResult(
                        error=f"the binder at {url} answered {response.status} for {pod}: {text}"
                    )
                return ExtenderBindingResult.model_validate_json(body)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("forwarding bind failed", extra={"pod": pod, "binder": url, "error": str(exc)})
            reason = str(exc) or type(exc).__name__
            return ExtenderBindingResult(error=f"forwarding bind of {pod} to the binder at {url}: {reason}")

    def _client_ssl(self) -> ssl.SSLContext | bool:
        if self._ssl is None:
            return True
        return self._ssl if isinstance(self._ssl, ssl.SSLContext) else self._ssl()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
