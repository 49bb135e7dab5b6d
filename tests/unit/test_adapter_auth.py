"""Authentication and authorization: the pure rules as tables, then the real TLS listener with real certs.

The TLS part serves the app on 127.0.0.1 with a front-proxy CA and a client CA (generated with the test bed's
PKI helpers) and calls it as kube-aggregator would (front-proxy client certificate + X-Remote-* headers), as
an ordinary client-certificate user, with a bearer token, and anonymously. TokenReview and
SubjectAccessReview are fakes that record what they were asked.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from adapter import auth, certjudge, tls
from adapter.app import Adapter
from adapter.routing import route
from adapter.server import AdapterState, Security, build_app
from gpuwarden.config.root import Config
from gpuwarden.x509lite import Certificate
from harness.localprom import find_free_port
from harness.testbed.pki import KeyPair, issue, make_ca

FRONT_CA = make_ca("front-proxy-ca")
CLIENT_CA = make_ca("client-ca")
OTHER_CA = make_ca("other-ca")
FRONT = issue(FRONT_CA, "front-proxy-client", client=True)
FRONT_WRONG_CN = issue(FRONT_CA, "somebody-else", client=True)
UNTRUSTED_FRONT = issue(OTHER_CA, "front-proxy-client", client=True)
ALICE = issue(CLIENT_CA, "alice", organizations=("team-a", "team-b"), client=True)
HPA = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
PODS_PATH = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/%2A/gpu_utilization"


def cert(pair: KeyPair) -> Certificate:
    return tls.load_certificates(pair.cert_pem)[0]


RH = auth.RequestHeaderConfig(ca=(cert(FRONT_CA),), allowed_names=("front-proxy-client",))
HEADERS = {
    "x-remote-user": [HPA],
    "x-remote-group": ["system:serviceaccounts", "system:authenticated"],
    "x-remote-extra-scopes%2Fa": ["x"],
}


@pytest.mark.parametrize(
    ("config", "pair", "headers", "user"),
    [
        pytest.param(
            RH,
            FRONT,
            HEADERS,
            auth.UserInfo(
                HPA, ("system:serviceaccounts", "system:authenticated"), extra={"scopes/a": ("x",)}
            ),
            id="front-proxy",
        ),
        pytest.param(RH, FRONT_WRONG_CN, HEADERS, None, id="cn-not-allowed"),
        pytest.param(
            auth.RequestHeaderConfig(ca=(cert(FRONT_CA),)),
            FRONT_WRONG_CN,
            {"x-remote-user": ["u"]},
            auth.UserInfo("u"),
            id="empty-allowed-names-means-any-cn",
        ),
        pytest.param(RH, UNTRUSTED_FRONT, HEADERS, None, id="other-ca"),
        pytest.param(RH, FRONT, {"x-remote-group": ["g"]}, None, id="no-user-header"),
        pytest.param(
            RH, FRONT, {"x-remote-user": ["", "second"]}, auth.UserInfo("second"), id="first-non-empty"
        ),
    ],
)
def test_requestheader_user(
    config: auth.RequestHeaderConfig,
    pair: KeyPair,
    headers: Mapping[str, list[str]],
    user: auth.UserInfo | None,
) -> None:
    issued, _ = certjudge.verdict(cert(pair).der, [c.der for c in config.ca], [])
    assert auth.requestheader_user(config, cert(pair), issued, headers) == user


def test_client_certificate_user() -> None:
    assert auth.cert_user(cert(ALICE)) == auth.UserInfo("alice", ("team-a", "team-b"))


def der(pair: KeyPair) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pair.cert_pem.decode())


async def test_certificate_verdicts_are_remembered_per_trust() -> None:
    authenticator = auth.Authenticator(RH, (cert(CLIENT_CA),), None)
    for _ in range(2):  # the second time from the memo: the same answers
        assert await authenticator.authenticate(der(FRONT), HEADERS) == auth.UserInfo(
            HPA, ("system:serviceaccounts", "system:authenticated"), extra={"scopes/a": ("x",)}
        )
        assert await authenticator.authenticate(der(FRONT), {"x-remote-group": ["g"]}) is None
        assert await authenticator.authenticate(der(ALICE), HEADERS) == auth.UserInfo(
            "alice", ("team-a", "team-b")
        )
        assert await authenticator.authenticate(der(UNTRUSTED_FRONT), HEADERS) is None
    # a new trust (CA rotation) judges every certificate again
    authenticator.replace_trust(auth.retrust(authenticator.trust, [cert(OTHER_CA)], []))
    assert await authenticator.authenticate(der(FRONT), HEADERS) is None
    assert await authenticator.authenticate(der(ALICE), HEADERS) is None
    assert await authenticator.authenticate(der(UNTRUSTED_FRONT), HEADERS) is not None


class CountingJudge:
    """`certjudge`'s verdicts in this process, counted; `gate` holds every check until set."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail
        self.gate = asyncio.Event()

    async def __call__(
        self, cert_der: bytes, rh: Sequence[Certificate], client: Sequence[Certificate]
    ) -> auth.Verdict:
        self.calls += 1
        await self.gate.wait()
        if self.fail:
            raise OSError("the child died")
        front, by_client = certjudge.verdict(cert_der, [c.der for c in rh], [c.der for c in client])
        common_names, organizations = certjudge.subject(cert_der)
        return auth.Verdict(front, by_client, tuple(common_names), tuple(organizations))


async def test_concurrent_requests_with_one_certificate_wait_for_one_check() -> None:
    judge = CountingJudge()
    authenticator = auth.Authenticator(RH, (cert(CLIENT_CA),), None, judge)
    waiting = [asyncio.ensure_future(authenticator.authenticate(der(FRONT), HEADERS)) for _ in range(5)]
    await asyncio.sleep(0)
    judge.gate.set()
    users = await asyncio.gather(*waiting)
    assert judge.calls == 1
    assert all(u is not None and u.name == HPA for u in users)


async def test_a_failed_check_counts_as_no_trusted_ca_and_is_tried_again_only_after_a_while() -> None:
    judge = CountingJudge(fail=True)
    judge.gate.set()
    now = [1000.0]
    authenticator = auth.Authenticator(RH, (cert(CLIENT_CA),), None, judge, clock=lambda: now[0])
    assert await authenticator.authenticate(der(FRONT), HEADERS) is None
    judge.fail = False
    now[0] += auth.JUDGE_RETRY_SECONDS - 1
    assert await authenticator.authenticate(der(FRONT), HEADERS) is None  # not a child per request
    assert judge.calls == 1
    now[0] += 2
    assert await authenticator.authenticate(der(FRONT), HEADERS) is not None
    assert judge.calls == 2


async def test_a_cancelled_check_leaves_the_waiters_to_judge_again() -> None:
    judge = CountingJudge()
    authenticator = auth.Authenticator(RH, (cert(CLIENT_CA),), None, judge)
    first = asyncio.ensure_future(authenticator.authenticate(der(FRONT), HEADERS))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(authenticator.authenticate(der(FRONT), HEADERS))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    judge.gate.set()
    user = await second
    assert user is not None and user.name == HPA
    assert first.cancelled() and judge.calls == 2


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        pytest.param(
            "GET",
            PODS_PATH,
            {
                "resourceAttributes": {
                    "verb": "get",
                    "group": "custom.metrics.k8s.io",
                    "version": "v1beta2",
                    "namespace": "ml",
                    "resource": "pods",
                    "name": "*",
                    "subresource": "gpu_utilization",
                }
            },
            id="custom-wildcard",
        ),
        pytest.param(
            "GET",
            "/apis/custom.metrics.k8s.io/v1beta1/nodes/n1/gpu_utilization",
            {
                "resourceAttributes": {
                    "verb": "get",
                    "group": "custom.metrics.k8s.io",
                    "version": "v1beta1",
                    "resource": "nodes",
                    "name": "n1",
                    "subresource": "gpu_utilization",
                }
            },
            id="custom-root-scoped",
        ),
        pytest.param(
            "GET",
            "/apis/custom.metrics.k8s.io/v1beta1/namespaces/ml/metrics/queue",
            {
                "resourceAttributes": {
                    "verb": "get",
                    "group": "custom.metrics.k8s.io",
                    "version": "v1beta1",
                    "namespace": "ml",
                    "resource": "metrics",
                    "name": "queue",
                }
            },
            id="namespace-metric-as-requestinfo-sees-it",
        ),
        pytest.param(
            "GET",
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/qps?labelSelector=a%3Db",
            {
                "resourceAttributes": {
                    "verb": "list",
                    "namespace": "ml",
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "resource": "qps",
                }
            },
            id="external-is-list",
        ),
        pytest.param(
            "GET",
            "/apis/custom.metrics.k8s.io/v1beta1",
            {"nonResourceAttributes": {"path": "/apis/custom.metrics.k8s.io/v1beta1", "verb": "get"}},
            id="discovery-non-resource",
        ),
    ],
)
def test_review_attributes(method: str, path: str, expected: dict[str, Any]) -> None:
    try:
        target = route(path, {})
    except Exception:
        target = None
    assert auth.review_attributes(method, path, target) == expected


@pytest.mark.parametrize(
    ("user", "attributes", "allowed"),
    [
        pytest.param(auth.UserInfo("x", ("system:masters",)), {"resourceAttributes": {}}, True, id="masters"),
        pytest.param(
            auth.UserInfo("system:kube-aggregator"),
            {"nonResourceAttributes": {}},
            True,
            id="aggregator-discovery",
        ),
        pytest.param(
            auth.UserInfo("system:kube-aggregator"),
            {"resourceAttributes": {}},
            False,
            id="aggregator-values-need-review",
        ),
        pytest.param(auth.UserInfo(HPA), {"resourceAttributes": {}}, False, id="others-need-review"),
    ],
)
def test_allowed_without_review(user: auth.UserInfo, attributes: dict[str, Any], allowed: bool) -> None:
    assert auth.allowed_without_review(user, attributes) is allowed


# --- over real TLS ---------------------------------------------------------------------------------


class Reviews:
    def __init__(self) -> None:
        self.asked: list[tuple[str, Mapping[str, Any]]] = []
        self.allow = {HPA, "alice", "token-user"}

    async def token(self, token: str) -> auth.UserInfo | None:
        return auth.UserInfo("token-user", ("system:authenticated",)) if token == "good" else None

    async def authorize(self, user: auth.UserInfo, attributes: Mapping[str, Any]) -> bool:
        self.asked.append((user.name, attributes))
        return user.name in self.allow


@pytest_asyncio.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, Reviews, Path]]:
    config = Config.model_validate(
        {
            "prometheus": {"url": "http://127.0.0.1:1", "retries": 0},
            "adapter": {"authentication": {"enabled": False}},
        }
    )
    adapter = Adapter(config)
    reviews = Reviews()
    authenticator = auth.Authenticator(RH, (cert(CLIENT_CA),), reviews.token)
    security = Security(authenticator, reviews.authorize)
    app = build_app(
        AdapterState(
            adapter.provider,
            lambda: adapter.discovery.registry,
            lambda: None,  # not_ready: always ready
            adapter.metrics,
            adapter.collector_registry,
            security,
        )
    )
    ctx, cert_pem = tls.server_context(None, None, client_cas=authenticator.trusted_cas())
    (tmp_path / "server.crt").write_bytes(cert_pem)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = find_free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx).start()
    try:
        yield f"https://127.0.0.1:{port}", reviews, tmp_path
    finally:
        await runner.cleanup()
        await adapter.prometheus.aclose()


def client_ssl(directory: Path, pair: KeyPair | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(directory / "server.crt"))
    if pair is not None:
        cert_path, key_path = pair.write(directory, "client")
        ctx.load_cert_chain(cert_path, key_path)
    return ctx


async def status_of(
    url: str, directory: Path, pair: KeyPair | None, headers: dict[str, str] | None = None
) -> int:
    ctx = client_ssl(directory, pair)
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, ssl=ctx, headers=headers or {}) as response,
    ):
        return response.status


async def test_front_proxy_user_is_authorized_with_requestinfo_attributes(
    server: tuple[str, Reviews, Path],
) -> None:
    base, reviews, directory = server
    headers = {"X-Remote-User": HPA, "X-Remote-Group": "system:serviceaccounts"}
    assert await status_of(base + "/apis/custom.metrics.k8s.io/v1beta2", directory, FRONT, headers) == 200
    assert reviews.asked[-1][0] == HPA
    # the metric route itself reaches the provider (404: no such metric discovered) only after authorization
    assert await status_of(base + PODS_PATH, directory, FRONT, headers) == 404
    assert reviews.asked[-1] == (HPA, auth.review_attributes("GET", PODS_PATH, route(PODS_PATH, {})))


async def test_rejections(server: tuple[str, Reviews, Path]) -> None:
    base, reviews, directory = server
    url = base + "/apis/custom.metrics.k8s.io/v1beta2"
    assert await status_of(url, directory, None) == 401
    assert await status_of(url, directory, None, {"X-Remote-User": HPA}) == 401  # headers need the proxy cert
    assert await status_of(url, directory, None, {"Authorization": "Bearer bad"}) == 401
    assert await status_of(url, directory, FRONT, {"X-Remote-User": "mallory"}) == 403
    assert await status_of(url, directory, FRONT_WRONG_CN, {"X-Remote-User": HPA}) == 401
    with pytest.raises(aiohttp.ClientError):  # a certificate from an unknown CA fails the handshake
        await status_of(url, directory, UNTRUSTED_FRONT, {"X-Remote-User": HPA})
    assert "mallory" in [name for name, _ in reviews.asked]


async def test_other_accepted_identities(server: tuple[str, Reviews, Path]) -> None:
    base, reviews, directory = server
    url = base + "/apis/custom.metrics.k8s.io/v1beta1"
    assert await status_of(url, directory, ALICE, {"X-Remote-User": "ignored"}) == 200
    assert reviews.asked[-1][0] == "alice"
    assert await status_of(url, directory, None, {"Authorization": "Bearer good"}) == 200
    assert reviews.asked[-1][0] == "token-user"
    asked = len(reviews.asked)
    masters = {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"}
    assert await status_of(url, directory, FRONT, masters) == 200
    assert await status_of(url, directory, FRONT, {"X-Remote-User": "system:kube-aggregator"}) == 200
    assert len(reviews.asked) == asked  # neither needed a SubjectAccessReview
    for probe in ("/healthz", "/livez", "/readyz"):
        assert await status_of(base + probe, directory, None) == 200
