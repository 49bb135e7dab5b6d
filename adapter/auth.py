"""Who is calling, and may they: front-proxy client certificates, bearer tokens, SubjectAccessReview.

Why: behind an APIService, kube-apiserver has already authenticated the HPA controller and forwards its
identity in `X-Remote-*` headers over a connection authenticated with its front-proxy client certificate.
We accept those headers only on such a connection (certificate issued by the requestheader CA, CN in the
allowed names), as k8s.io/apiserver does; other callers may use an ordinary client certificate (CN = user,
O = groups) or a bearer token checked with a TokenReview. Authorization is delegated with a
SubjectAccessReview carrying the same attributes kube-apiserver's RequestInfo would produce, so RBAC rules
written for prometheus-adapter keep working. `system:masters` and the aggregator's discovery calls
(`system:kube-aggregator`) are allowed without a review; answers are cached for `cache_ttl` seconds.

The pure parts (`requestheader_user`, `cert_user`, `review_attributes`, `allowed_without_review`) are
table-tested; `KubeReviews` is the shell that posts reviews through `gpuwarden.kube`. Which CA signed a
client certificate is checked in a child process (`adapter.certjudge`, once per certificate and trust): this
process reads certificates with `gpuwarden.x509lite` and does not import `cryptography`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from adapter.routing import CustomRoute, ExternalRoute, ResourceRoute, Route
from adapter.tls import load_certificates
from gpuwarden import x509lite
from gpuwarden.errors import KubeError
from gpuwarden.kube import CONFIG_MAPS, KubeClient
from gpuwarden.x509lite import Certificate

if TYPE_CHECKING:
    from gpuwarden.config.adapter import Authentication

log = logging.getLogger(__name__)

Headers = Mapping[str, Sequence[str]]  # lower-cased header name -> every value
AUTH_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
MASTERS = "system:masters"
AGGREGATOR = "system:kube-aggregator"


@dataclass(frozen=True)
class UserInfo:
    """An authenticated caller."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestHeaderConfig:
    """The front-proxy trust settings (from files or the extension-apiserver-authentication ConfigMap)."""

    ca: tuple[Certificate, ...]
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)
    uid_headers: tuple[str, ...] = ()


def requestheader_user(
    cfg: RequestHeaderConfig, cert: Certificate, issued: bool, headers: Headers
) -> UserInfo | None:
    """The user asserted in headers by a trusted front proxy, or None if `cert` is not one / no user.
    `issued`: whether a requestheader CA signed `cert` (`judge_in_child`)."""
    return headers_user(cfg, headers) if front_proxy(cfg, cert, issued) else None


def front_proxy(cfg: RequestHeaderConfig, cert: Certificate, issued: bool) -> bool:
    """Whether `cert` is a front proxy's: issued by the requestheader CA, its one CN among the allowed
    names (any subject when no names are configured, as k8s.io/apiserver's requestheader authenticator)."""
    if not issued:
        return False
    return not cfg.allowed_names or sole_common_name(cert) in cfg.allowed_names


def headers_user(cfg: RequestHeaderConfig, headers: Headers) -> UserInfo | None:
    """The user a front proxy asserts in `headers` (None: no user name header)."""
    name = next((v for h in cfg.username_headers for v in headers.get(h.lower(), ()) if v), "")
    if not name:
        return None
    groups = tuple(v for h in cfg.group_headers for v in headers.get(h.lower(), ()) if v)
    uid = next((v for h in cfg.uid_headers for v in headers.get(h.lower(), ()) if v), "")
    extra: dict[str, tuple[str, ...]] = {}
    for header, values in headers.items():
        for prefix in cfg.extra_prefixes:
            if header.startswith(prefix.lower()):
                key = unquote(header[len(prefix) :].lower())
                extra[key] = extra.get(key, ()) + tuple(values)
    return UserInfo(name, groups, uid, extra)


def sole_common_name(cert: Certificate) -> str | None:
    """The subject's CN when it has exactly one (and it is not empty); None otherwise.

    Kubernetes names the user `chain[0].Subject.CommonName` (k8s.io/apiserver's x509
    `CommonNameUserConversion`), which Go's pkix fills with the *last* CN of the subject; readers that take
    the first (OpenSSL's tools, many libraries) would see someone else in a subject with two. A subject
    with other than one CN names no user here: refused, rather than read one way of two.
    """
    if len(cert.common_names) != 1 or not cert.common_names[0]:
        return None
    return cert.common_names[0]


def cert_user(cert: Certificate) -> UserInfo | None:
    """An ordinary client certificate: its one CN is the user, O entries are the groups."""
    name = sole_common_name(cert)
    return UserInfo(name, cert.organizations) if name is not None else None


def review_attributes(method: str, path: str, route: Route | None) -> dict[str, Any]:
    """SubjectAccessReview attributes for a request, as kube-apiserver's RequestInfo would derive them."""
    verb = method.lower()
    if isinstance(route, CustomRoute):
        parts = path.split("?", 1)[0].strip("/").split("/")[3:]
        namespace = ""
        if parts[0] == "namespaces" and len(parts) > 2:
            namespace, parts = parts[1], parts[2:]
        attrs = {
            "verb": verb,
            "group": "custom.metrics.k8s.io",
            "version": route.version,
            "resource": unquote(parts[0]),
            "name": unquote(parts[1]),
        }
        if len(parts) > 2:
            attrs["subresource"] = unquote(parts[2])
        if namespace:
            attrs["namespace"] = namespace
        return {"resourceAttributes": attrs}
    if isinstance(route, ExternalRoute):
        return {
            "resourceAttributes": {
                "verb": "list" if verb == "get" else verb,
                "namespace": route.namespace,
                "group": "external.metrics.k8s.io",
                "version": "v1beta1",
                "resource": route.metric,
            }
        }
    if isinstance(route, ResourceRoute):
        resource_attrs = {
            "verb": verb if route.name or verb != "get" else "list",
            "group": "metrics.k8s.io",
            "version": "v1beta1",
            "resource": route.kind,
        }
        if route.name:
            resource_attrs["name"] = route.name
        if route.namespace:
            resource_attrs["namespace"] = route.namespace
        return {"resourceAttributes": resource_attrs}
    return {"nonResourceAttributes": {"path": path.split("?", 1)[0], "verb": verb}}


def allowed_without_review(user: UserInfo, attributes: Mapping[str, Any]) -> bool:
    """system:masters always; the aggregator for non-resource (discovery, openapi) GETs."""
    if MASTERS in user.groups:
        return True
    return user.name == AGGREGATOR and "nonResourceAttributes" in attributes


class TtlCache:
    """A tiny TTL memo for review answers."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic, limit: int = 4096) -> None:
        self._ttl, self._clock, self._limit = ttl, clock, limit
        self._data: dict[str, tuple[float, Any]] = {}

    def get(self, key: str) -> Any:
        hit = self._data.get(key)
        if hit is None or self._clock() - hit[0] > self._ttl:
            return None
        return hit[1]

    def age(self, key: str) -> tuple[float, Any] | None:
        """(seconds since it was put, value) of an entry, expired or not; None when there is none."""
        hit = self._data.get(key)
        return None if hit is None else (self._clock() - hit[0], hit[1])

    def put(self, key: str, value: Any) -> None:
        if len(self._data) >= self._limit:
            self._data.clear()
        self._data[key] = (self._clock(), value)


def review_due(age: float | None, value: Any, ttl: float, stale_allowed: float) -> str:
    """What to do with a cached SubjectAccessReview answer `age` seconds old (None: none cached).

    "use" it (within the TTL); "use-and-refresh": an *allow* past its TTL by at most `stale_allowed` is used
    while one review re-asks in the background, whose answer replaces it; "ask" in the request (nothing
    cached, a deny past its TTL - a deny is never used stale - or an allow too old)."""
    if age is None:
        return "ask"
    if age <= ttl:
        return "use"
    if value is True and age <= ttl + stale_allowed:
        return "use-and-refresh"
    return "ask"


USED_LIMIT = 4096
"""Keys the re-checker remembers at most (as many as `TtlCache` keeps answers)."""
RECHECK_CONCURRENCY = 4
"""Background re-checks in flight at most (each one review round trip on a kept-alive connection)."""
RECHECK_LEAD = 2.0
"""Seconds before its TTL ends that an allow in use is re-asked in the background (`recheck_due`)."""


def recheck_due(age: float | None, value: Any, idle: float, ttl: float, stale_allowed: float) -> bool:
    """Whether the background re-checker re-asks an answer `age` seconds old, last asked for `idle` seconds
    ago, now - before any request finds it expired.

    Only with refresh-ahead on, only an allow, only one in use (asked for within `ttl + stale_allowed`),
    and only in the last `RECHECK_LEAD` seconds of its TTL (or after). Why: the HPA controller's syncs come
    in bursts; without it the first request of each key in a burst starts that key's re-check, so one
    review per key lands inside every burst (200 at 1,000 HPAs), competing with the requests for the CPU.
    """
    if age is None or value is not True or stale_allowed <= 0 or idle > ttl + stale_allowed:
        return False
    return age >= ttl - min(RECHECK_LEAD, ttl / 2)


class KubeReviews:
    """TokenReview and SubjectAccessReview through the API server, cached.

    `stale_allowed` seconds of refresh-ahead for allowed answers (`review_due`): the HPA controller asks
    every 15 s and an answer lives 10 s, so without it every sync would wait for a review round trip - the
    adapter's p99. With it the caller gets the answer it had while the re-check runs; a revoked grant is then
    honoured for at most TTL + `stale_allowed` (kube-apiserver's own webhook authorizer caches allows 5 min).
    """

    def __init__(
        self,
        kube: KubeClient,
        ttl: float,
        stale_allowed: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._ttl, self._stale_allowed = ttl, stale_allowed
        self._tokens = TtlCache(ttl, clock)
        self._access = TtlCache(ttl, clock)
        self._asking: dict[str, asyncio.Future[bool]] = {}
        self._used: dict[str, tuple[float, dict[str, Any]]] = {}
        """Review key -> (when last asked for, its spec), for the background re-checker."""
        self._clock = clock

    async def user_for_token(self, token: str) -> UserInfo | None:
        cached = self._tokens.get(token)
        if cached is not None:
            return cached if isinstance(cached, UserInfo) else None
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        answer = await self._kube.request(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            verb="create",
            resource="tokenreviews",
            body=body,
            content_type="application/json",
        )
        status = answer.get("status") or {}
        user: UserInfo | bool = False
        if status.get("authenticated"):
            info = status.get("user") or {}
            extra = {k: tuple(v) for k, v in (info.get("extra") or {}).items()}
            user = UserInfo(
                info.get("username", ""), tuple(info.get("groups") or ()), info.get("uid", ""), extra
            )
        self._tokens.put(token, user)
        return user if isinstance(user, UserInfo) else None

    async def allowed(self, user: UserInfo, attributes: Mapping[str, Any]) -> bool:
        spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups), **attributes}
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra.items()}
        key = json.dumps(spec, sort_keys=True)
        if self._stale_allowed > 0:
            if len(self._used) >= USED_LIMIT and key not in self._used:
                self._used.clear()  # bounded like the answers (TtlCache); re-filled by the next requests
            self._used[key] = (self._clock(), spec)
        age, value = self._access.age(key) or (None, None)
        due = review_due(age, value, self._ttl, self._stale_allowed)
        if due == "use":
            return bool(value)
        if due == "use-and-refresh":
            self._ask(key, spec).add_done_callback(_consume)  # a failed re-check: the next caller asks
            return True
        # One review per question in flight: the HPA controller's workers ask about the same namespace and
        # metric at once when its answer has expired (every sync, as the cache lives 10 s and a sync comes
        # every 15 s); the others wait for that answer instead of each posting its own.
        return await asyncio.shield(self._ask(key, spec))

    def due_rechecks(self) -> list[tuple[str, dict[str, Any]]]:
        """(key, spec) of every answer `recheck_due` and not being asked; forgets keys no longer asked for."""
        now = self._clock()
        due: list[tuple[str, dict[str, Any]]] = []
        for key, (used, spec) in list(self._used.items()):
            idle = now - used
            if idle > self._ttl + self._stale_allowed:
                del self._used[key]
                continue
            age, value = self._access.age(key) or (None, None)
            if key not in self._asking and recheck_due(age, value, idle, self._ttl, self._stale_allowed):
                due.append((key, spec))
        return due

    async def recheck(self) -> int:
        """Re-ask every answer due, `RECHECK_CONCURRENCY` at a time; returns how many were due.

        Paced: at 1,000 HPAs 200 answers fall due together, and 200 reviews at once opened as many new
        connections to the API server (TLS handshakes on the event loop, and their buffers in the RSS)."""
        due = self.due_rechecks()
        limit = asyncio.Semaphore(RECHECK_CONCURRENCY)

        async def one(key: str, spec: dict[str, Any]) -> None:
            async with limit:
                asking = self._ask(key, spec)  # the one in flight if a request asked meanwhile
                asking.add_done_callback(_consume)  # a failure is logged there, not raised here
                await asyncio.wait([asking])

        await asyncio.gather(*(one(key, spec) for key, spec in due))
        return len(due)

    async def run_rechecks(self, tick: float = 1.0) -> None:
        """`recheck` every `tick` seconds, forever (a no-op with refresh-ahead off)."""
        if self._stale_allowed <= 0:
            return
        while True:
            await asyncio.sleep(tick)
            await self.recheck()

    def _ask(self, key: str, spec: dict[str, Any]) -> asyncio.Future[bool]:
        """The review of `key` in flight, started if there is none."""
        asking = self._asking.get(key)
        if asking is None:
            asking = self._asking[key] = asyncio.ensure_future(self._review(key, spec))
            asking.add_done_callback(lambda done: self._asking.pop(key, None))
        return asking

    async def _review(self, key: str, spec: dict[str, Any]) -> bool:
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        answer = await self._kube.request(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            verb="create",
            resource="subjectaccessreviews",
            body=body,
            content_type="application/json",
        )
        allowed = bool((answer.get("status") or {}).get("allowed"))
        self._access.put(key, allowed)
        return allowed


def _consume(done: asyncio.Future[bool]) -> None:
    """Retrieve a background review's error (logged, not raised: the answer it would replace expires)."""
    if not done.cancelled() and (error := done.exception()) is not None:
        log.warning("SubjectAccessReview re-check failed", extra={"error": str(error)})


@dataclass(frozen=True)
class Trust:
    """Which CAs the authenticator trusts: replaced whole when a CA file changes (`gpuwarden.certreload`)."""

    requestheader: RequestHeaderConfig | None
    client_cas: tuple[Certificate, ...]

    def cas(self) -> list[Certificate]:
        """Every trusted CA, for the TLS layer's client-certificate verification."""
        return [*(self.requestheader.ca if self.requestheader else ()), *self.client_cas]


def retrust(
    trust: Trust,
    requestheader_ca: Sequence[Certificate],
    client_cas: Sequence[Certificate],
    allowed_names: Sequence[str] = (),
) -> Trust:
    """Pure: `trust` with these CA sets, keeping the front-proxy header settings.

    No front-proxy CA: no front-proxy trust. A front-proxy CA where there was none gets the default headers
    and `allowed_names`.
    """
    requestheader = None
    if requestheader_ca:
        requestheader = (
            replace(trust.requestheader, ca=tuple(requestheader_ca))
            if trust.requestheader is not None
            else RequestHeaderConfig(ca=tuple(requestheader_ca), allowed_names=tuple(allowed_names))
        )
    return Trust(requestheader, tuple(client_cas))


SEEN_CERTIFICATES = 64
"""Client certificates whose verdict is remembered (callers are a few aggregators and controllers)."""
JUDGE_RETRY_SECONDS = 30.0
"""A certificate whose check failed to run (the child did not answer) is not checked again for this long:
at most one child per certificate per interval, whatever the request rate."""


def cert_key(cert_der: bytes) -> bytes:
    """What a certificate's verdict is remembered by: the sha256 of its DER."""
    return hashlib.sha256(cert_der).digest()


@dataclass(frozen=True, slots=True)
class CertFacts:
    """A client certificate as `trust` sees it: a front proxy's, and/or a user of the client CAs."""

    trust: Trust
    front_proxy: bool
    client_user: UserInfo | None


@dataclass(frozen=True, slots=True)
class Verdict:
    """What `adapter.certjudge` (with `cryptography`) found: which CA set signed a client certificate, and
    the certificate's subject as it reads it."""

    by_front_proxy_ca: bool
    by_client_ca: bool
    common_names: tuple[str, ...]
    organizations: tuple[str, ...]
    readable: bool = True
    """False: `cryptography` could not read the certificate (then signed by no trusted CA)."""


Judge = Callable[[bytes, Sequence[Certificate], Sequence[Certificate]], Awaitable[Verdict]]
"""(client certificate DER, front-proxy CAs, client CAs) -> `Verdict`."""


async def judge_in_child(
    cert_der: bytes, requestheader: Sequence[Certificate], client: Sequence[Certificate]
) -> Verdict:
    """The signature checks of `adapter.certjudge`, in a short child process (this one does not import
    `cryptography`). Raises `OSError` if the child fails."""
    request = {
        "cert": base64.b64encode(cert_der).decode(),
        "requestheader": [base64.b64encode(c.der).decode() for c in requestheader],
        "client": [base64.b64encode(c.der).decode() for c in client],
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "adapter.certjudge",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    out, err = await proc.communicate(json.dumps(request).encode())
    if proc.returncode != 0:
        raise OSError(f"client certificate check failed: {err.decode(errors='replace').strip()[-500:]}")
    try:
        answer = json.loads(out)
        return Verdict(
            bool(answer["requestheader"]),
            bool(answer["client"]),
            tuple(str(c) for c in answer["common_names"]),
            tuple(str(o) for o in answer["organizations"]),
            readable=bool(answer["readable"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise OSError(f"client certificate check answered {out[:200]!r}: {exc}") from None


class Authenticator:
    """Everything needed to authenticate a request; the trusted CAs may be replaced while serving."""

    def __init__(
        self,
        requestheader: RequestHeaderConfig | None,
        client_cas: tuple[Certificate, ...],
        token_review: Callable[[str], Awaitable[UserInfo | None]] | None,
        judge: Judge = judge_in_child,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.trust = Trust(requestheader, client_cas)  # read once per request, replaced whole
        self.token_review = token_review
        self._judge = judge
        self._clock = clock
        self._seen: OrderedDict[bytes, CertFacts] = OrderedDict()
        """Certificate digest -> verdict, least recently used first; at most SEEN_CERTIFICATES."""
        self._failed: dict[bytes, tuple[float, CertFacts]] = {}
        """Certificate digest -> (when its check failed to run, the no-trust facts used meanwhile)."""
        self._judging: dict[bytes, asyncio.Future[CertFacts]] = {}

    @property
    def requestheader(self) -> RequestHeaderConfig | None:
        return self.trust.requestheader

    @property
    def client_cas(self) -> tuple[Certificate, ...]:
        return self.trust.client_cas

    def replace_trust(self, trust: Trust) -> None:
        """Trust these CAs from the next request on (one assignment: atomic on the event loop)."""
        self.trust = trust

    async def authenticate(self, cert_der: bytes | None, headers: Headers) -> UserInfo | None:
        if cert_der:
            trust = self.trust
            facts = await self._facts(trust, cert_der)
            if facts.front_proxy and trust.requestheader is not None:
                user = headers_user(trust.requestheader, headers)
                if user is not None:
                    return user
            if facts.client_user is not None:
                return facts.client_user
        auth = next(iter(headers.get("authorization", ())), "")
        if auth.lower().startswith("bearer ") and self.token_review is not None:
            try:
                return await self.token_review(auth[7:].strip())
            except KubeError as exc:
                log.warning("token review failed", extra={"error": str(exc)})
        return None

    async def _facts(self, trust: Trust, cert_der: bytes) -> CertFacts:
        """What `trust` makes of this client certificate, remembered per certificate and trust.

        The aggregator presents the same front-proxy certificate on every connection: parsing it and
        checking its signature on every request was a fifth of a request's CPU, and the check now runs in a
        child process (`judge_in_child`). The TLS handshake still verifies each connection's certificate
        (validity included); a new `Trust` forgets every answer. Requests arriving while a certificate is
        being judged wait for that one verdict. Answers are remembered by the certificate's digest
        (`cert_key`), the least recently used dropped first. A certificate either reader cannot read is a
        verdict like any other (no CA's); a check that failed to run counts as no CA's and is tried again
        after `JUDGE_RETRY_SECONDS`, never once per request.
        """
        key = cert_key(cert_der)
        hit = self._seen.get(key)
        if hit is not None and hit.trust is trust:
            self._seen.move_to_end(key)
            return hit
        failed = self._failed.get(key)
        if failed is not None and failed[1].trust is trust:
            if self._clock() - failed[0] < JUDGE_RETRY_SECONDS:
                return failed[1]
            del self._failed[key]
        pending = self._judging.get(key)
        if pending is not None:
            try:
                facts = await asyncio.shield(pending)
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # this request was cancelled
            else:
                if facts.trust is trust:
                    return facts
        future: asyncio.Future[CertFacts] = asyncio.get_running_loop().create_future()
        self._judging[key] = future
        try:
            facts = await self._judged(trust, cert_der, key)
            future.set_result(facts)
        finally:
            if not future.done():
                future.cancel()  # the judging request failed or was cancelled: a waiter judges again
            if self._judging.get(key) is future:
                del self._judging[key]
        return facts

    async def _judged(self, trust: Trust, cert_der: bytes, key: bytes) -> CertFacts:
        untrusted = CertFacts(trust, False, None)
        try:
            cert = x509lite.parse(cert_der)
        except ValueError as exc:
            log.warning("unreadable client certificate: not trusted", extra={"error": str(exc)})
            return self._remember(key, untrusted)
        rh_cas = trust.requestheader.ca if trust.requestheader is not None else ()
        try:
            verdict = await self._judge(cert_der, rh_cas, trust.client_cas)
        except OSError as exc:
            log.error("client certificate not judged: treated as no trusted CA's", extra={"error": str(exc)})
            self._failed[key] = (self._clock(), untrusted)
            if len(self._failed) > SEEN_CERTIFICATES:
                del self._failed[next(iter(self._failed))]
            return untrusted
        if not verdict.readable:
            log.warning(
                "client certificate unreadable to cryptography: not trusted",
                extra={"sha256": cert.fingerprint()},
            )
            return self._remember(key, untrusted)
        if (verdict.common_names, verdict.organizations) != (cert.common_names, cert.organizations):
            # two readers disagree on who this is: no identity from it (remembered: the bytes will not change)
            log.error(
                "client certificate subject read differently by x509lite and cryptography: not trusted",
                extra={"x509lite": [*cert.common_names, *cert.organizations],
                       "cryptography": [*verdict.common_names, *verdict.organizations]},
            )  # fmt: skip
            return self._remember(key, untrusted)
        rh = trust.requestheader
        proxy = rh is not None and front_proxy(rh, cert, verdict.by_front_proxy_ca)
        return self._remember(key, CertFacts(trust, proxy, cert_user(cert) if verdict.by_client_ca else None))

    def _remember(self, key: bytes, facts: CertFacts) -> CertFacts:
        """Keep `facts` for this certificate, dropping the least recently used beyond SEEN_CERTIFICATES."""
        self._seen[key] = facts
        self._seen.move_to_end(key)
        while len(self._seen) > SEEN_CERTIFICATES:
            self._seen.popitem(last=False)
        return facts

    def trusted_cas(self) -> list[Certificate]:
        return self.trust.cas()


def _json_list(data: Mapping[str, str], key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = data.get(key)
    if not raw:
        return default
    value = json.loads(raw)
    return tuple(str(v) for v in value) if isinstance(value, list) else default


CA_KEYS = {"requestheader": "requestheader-client-ca-file", "client": "client-ca-file"}
"""Trusted client CA kind -> its key in the authentication ConfigMap."""


async def fetch_configmap_cas(kube: KubeClient, kinds: Sequence[str]) -> dict[str, bytes]:
    """The PEM bundles of these CA kinds as the authentication ConfigMap holds them now (a kind whose key
    is missing or empty is left out: its CAs stay as they are). Raises `KubeError`."""
    cm = await kube.get(CONFIG_MAPS, AUTH_CONFIGMAP[1], namespace=AUTH_CONFIGMAP[0])
    data = cm.get("data") or {}
    return {kind: str(data[CA_KEYS[kind]]).encode() for kind in kinds if data.get(CA_KEYS[kind])}


async def load_trust(
    cfg: Authentication, kube: KubeClient | None
) -> tuple[RequestHeaderConfig | None, tuple[Certificate, ...]]:
    """Front-proxy settings and client CAs: from files, else from the authentication ConfigMap."""
    data: Mapping[str, str] = {}
    if kube is not None and (cfg.requestheader_client_ca_file is None or cfg.client_ca_file is None):
        try:
            cm = await kube.get(CONFIG_MAPS, AUTH_CONFIGMAP[1], namespace=AUTH_CONFIGMAP[0])
            data = cm.get("data") or {}
        except KubeError as exc:
            log.warning("cannot read the authentication ConfigMap", extra={"error": str(exc)})
    rh_pem = (
        cfg.requestheader_client_ca_file.read_bytes()
        if cfg.requestheader_client_ca_file
        else data.get(CA_KEYS["requestheader"], "").encode()
    )
    client_pem = (
        cfg.client_ca_file.read_bytes() if cfg.client_ca_file else data.get(CA_KEYS["client"], "").encode()
    )
    rh_cas = tuple(load_certificates(rh_pem))
    requestheader = None
    if rh_cas:
        names = cfg.requestheader_allowed_names
        requestheader = RequestHeaderConfig(
            ca=rh_cas,
            allowed_names=tuple(names)
            if names is not None
            else _json_list(data, "requestheader-allowed-names", ()),
            username_headers=_json_list(data, "requestheader-username-headers", ("X-Remote-User",)),
            group_headers=_json_list(data, "requestheader-group-headers", ("X-Remote-Group",)),
            extra_prefixes=_json_list(data, "requestheader-extra-headers-prefix", ("X-Remote-Extra-",)),
            uid_headers=_json_list(data, "requestheader-uid-headers", ()),
        )
    return requestheader, tuple(load_certificates(client_pem))
