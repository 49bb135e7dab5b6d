"""Client CA rotation: the pure verdict on a CA file, `auth.retrust`, and the reloader driving TLS and authn.

Handshakes are real TLS in memory (the helpers of test_adapter_certreload); the peer certificate the server
end saw is then given to the same `Authenticator` the reloader updated, as the request path would.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from adapter import auth, tls
from adapter.app import Adapter
from adapter.selfmetrics import new_metrics
from adapter.server import Security
from gpuwarden.certreload import CaSets, CertificateReloader, Outcome, decide_cas
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeError
from gpuwarden.kube import KubeClient
from gpuwarden.x509lite import Certificate
from harness.testbed import pki
from tests.unit.test_adapter_certreload import client_context, handshake, reloads

OLD_CA, NEW_CA = pki.make_ca("front-proxy-ca-1"), pki.make_ca("front-proxy-ca-2")
CLIENT_CA = pki.make_ca("client-ca")
OLD_FRONT = pki.issue(OLD_CA, "front-proxy-client", client=True)
NEW_FRONT = pki.issue(NEW_CA, "front-proxy-client", client=True)
HEADERS = {"x-remote-user": ["system:serviceaccount:kube-system:hpa"], "x-remote-group": ["g"]}


def certs(*pairs: pki.KeyPair) -> tuple[Certificate, ...]:
    return tuple(c for p in pairs for c in tls.load_certificates(p.cert_pem))


@pytest.mark.parametrize(
    ("judged", "loaded", "pem", "outcome", "reason"),
    [
        pytest.param(None, (OLD_CA,), OLD_CA.cert_pem, Outcome.UNCHANGED, "", id="first-look-same-cas"),
        pytest.param(None, (OLD_CA,), b"# rotated\n" + OLD_CA.cert_pem, Outcome.UNCHANGED, "", id="comment"),
        pytest.param(None, (OLD_CA,), NEW_CA.cert_pem, Outcome.SUCCESS, "", id="new-ca"),
        pytest.param(None, (OLD_CA,), OLD_CA.cert_pem + NEW_CA.cert_pem, Outcome.SUCCESS, "", id="added"),
        pytest.param(None, (), NEW_CA.cert_pem, Outcome.SUCCESS, "", id="none-before"),
        pytest.param(None, (OLD_CA,), b"", Outcome.INVALID, "holds no certificate", id="empty"),
        pytest.param(None, (OLD_CA,), b"not pem", Outcome.INVALID, "not PEM certificates", id="no-pem"),
        pytest.param(
            None, (OLD_CA,), NEW_CA.cert_pem[:150], Outcome.INVALID, "not PEM certificates", id="truncated"
        ),
        pytest.param("same", (OLD_CA,), NEW_CA.cert_pem, Outcome.UNCHANGED, "", id="already-judged"),
    ],
)
def test_decide_cas(
    judged: str | None, loaded: tuple[pki.KeyPair, ...], pem: bytes, outcome: Outcome, reason: str
) -> None:
    if judged == "same":
        judged = decide_cas(None, (), pem).digest
    decision = decide_cas(judged, certs(*loaded), pem)
    assert decision.outcome is outcome
    assert reason in decision.reason
    if outcome is Outcome.SUCCESS:
        assert decision.cas == tuple(tls.load_certificates(pem))


RH = auth.RequestHeaderConfig(
    ca=certs(OLD_CA), allowed_names=("front-proxy-client",), username_headers=("X-User",)
)


@pytest.mark.parametrize(
    ("trust", "rh_ca", "client", "expected"),
    [
        pytest.param(
            auth.Trust(RH, certs(CLIENT_CA)),
            certs(NEW_CA),
            certs(CLIENT_CA),
            auth.Trust(
                auth.RequestHeaderConfig(
                    ca=certs(NEW_CA), allowed_names=("front-proxy-client",), username_headers=("X-User",)
                ),
                certs(CLIENT_CA),
            ),
            id="front-proxy-ca-replaced-settings-kept",
        ),
        pytest.param(
            auth.Trust(None, ()),
            certs(NEW_CA),
            (),
            auth.Trust(auth.RequestHeaderConfig(ca=certs(NEW_CA), allowed_names=("fp",)), ()),
            id="front-proxy-ca-where-there-was-none",
        ),
        pytest.param(auth.Trust(RH, ()), (), certs(CLIENT_CA), auth.Trust(None, certs(CLIENT_CA)), id="gone"),
    ],
)
def test_retrust(
    trust: auth.Trust,
    rh_ca: tuple[Certificate, ...],
    client: tuple[Certificate, ...],
    expected: auth.Trust,
) -> None:
    assert auth.retrust(trust, rh_ca, client, ("fp",)) == expected


class Fetched:
    """The authentication ConfigMap as the reloader's `ca_fetch` reads it: PEM by kind, or `error` raised."""

    def __init__(self) -> None:
        self.pem: dict[str, bytes] = {"requestheader": OLD_CA.cert_pem}
        self.error: Exception | None = None
        self.reads = 0

    async def __call__(self) -> Mapping[str, bytes]:
        self.reads += 1
        if self.error is not None:
            raise self.error
        return dict(self.pem)


SOURCE = "ConfigMap kube-system/extension-apiserver-authentication"


class Setup:
    """A reloader watching a front-proxy CA file (self-signed serving pair, unwatched), wired like the app;
    with `fetched`, the front-proxy CA comes from the authentication ConfigMap instead of the file."""

    def __init__(self, tmp: Path, fetched: Fetched | None = None) -> None:
        self.tmp = tmp
        self.ca_file = tmp / "front-proxy-ca.crt"
        self.ca_file.write_bytes(OLD_CA.cert_pem)
        self.registry = CollectorRegistry()
        front_proxy = auth.RequestHeaderConfig(ca=certs(OLD_CA), allowed_names=("front-proxy-client",))
        self.authenticator = auth.Authenticator(front_proxy, certs(CLIENT_CA), None)
        pair = tls.self_signed(["adapter.test"])
        cas: CaSets = {"requestheader": certs(OLD_CA), "client": certs(CLIENT_CA)}
        self.reloader = CertificateReloader(
            tls.context_for(*pair, client_cas=[*certs(OLD_CA), *certs(CLIENT_CA)]),
            None,
            None,
            loaded=pair,
            metrics=new_metrics(self.registry),
            make_context=tls.context_for,
            client_cas=cas,
            ca_files={} if fetched else {"requestheader": self.ca_file},
            on_cas=self.swap,
            ca_fetch=fetched,
            ca_fetch_source=SOURCE if fetched else "",
        )

    def swap(self, cas: CaSets) -> None:
        trust = auth.retrust(self.authenticator.trust, cas["requestheader"], cas["client"])
        self.authenticator.replace_trust(trust)

    def rotate(self, pem: bytes) -> None:
        staged = self.ca_file.with_suffix(".new")
        staged.write_bytes(pem)
        staged.replace(self.ca_file)

    async def user(self, front: pki.KeyPair, stem: str) -> auth.UserInfo | None:
        """Handshake presenting `front` (raises `ssl.SSLError` if TLS refuses it), then authenticate."""
        _, server_end = handshake(self.reloader.ctx, client_context(cert=front, tmp=self.tmp / stem))
        return await self.authenticator.authenticate(server_end.getpeercert(binary_form=True), HEADERS)


VERIFY_FAILED = r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"


async def test_a_new_front_proxy_ca_is_trusted_by_tls_and_authentication_after_the_file_changes(
    tmp_path: Path,
) -> None:
    s = Setup(tmp_path)
    assert (await s.user(OLD_FRONT, "old")) is not None
    with pytest.raises(ssl.SSLError, match=VERIFY_FAILED):
        await s.user(NEW_FRONT, "new-before")
    assert s.reloader.poll() is Outcome.UNCHANGED
    with pytest.raises(ssl.SSLError, match=VERIFY_FAILED):
        await s.user(NEW_FRONT, "new-still-before")

    s.rotate(NEW_CA.cert_pem)
    assert s.reloader.poll() is Outcome.SUCCESS
    user = await s.user(NEW_FRONT, "new-after")
    assert user is not None and user.name == HEADERS["x-remote-user"][0] and user.groups == ("g",)
    assert s.authenticator.requestheader is not None
    assert s.authenticator.requestheader.allowed_names == ("front-proxy-client",)
    with pytest.raises(ssl.SSLError, match=VERIFY_FAILED):
        await s.user(OLD_FRONT, "old-after")  # the old CA is no longer in the file
    assert reloads(s.registry, "success") == 1
    assert s.reloader.poll() is Outcome.UNCHANGED
    assert reloads(s.registry, "success") == 1


async def test_client_ca_still_trusted_after_a_front_proxy_ca_rotation(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    alice = pki.issue(CLIENT_CA, "alice", organizations=("team-a",), client=True)
    s.rotate(NEW_CA.cert_pem)
    assert s.reloader.poll() is Outcome.SUCCESS
    user = await s.user(alice, "alice")
    assert user == auth.UserInfo("alice", ("team-a",))


@pytest.mark.parametrize("bad", [b"", b"garbage\n", NEW_CA.cert_pem[:150]], ids=["empty", "garbage", "cut"])
async def test_an_invalid_ca_file_keeps_the_old_cas(
    tmp_path: Path, bad: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    s = Setup(tmp_path)
    s.rotate(bad)
    with caplog.at_level(logging.ERROR, logger="gpuwarden.certreload"):
        assert s.reloader.poll() is Outcome.INVALID
        assert s.reloader.poll() is Outcome.UNCHANGED  # reported once per content
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.__dict__["kind"] == "requestheader"
    assert record.__dict__["ca_file"] == str(s.ca_file)
    assert reloads(s.registry, "invalid") == 1
    assert (await s.user(OLD_FRONT, "old")) is not None
    with pytest.raises(ssl.SSLError, match=VERIFY_FAILED):
        await s.user(NEW_FRONT, "new")
    s.rotate(NEW_CA.cert_pem)  # a later good file is taken
    assert s.reloader.poll() is Outcome.SUCCESS
    assert (await s.user(NEW_FRONT, "new-after")) is not None


async def test_an_unreadable_ca_file_keeps_the_old_cas(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.ca_file.unlink()
    assert s.reloader.poll() is Outcome.UNREADABLE
    assert s.reloader.poll() is Outcome.UNCHANGED
    assert reloads(s.registry, "unreadable") == 1
    assert (await s.user(OLD_FRONT, "old")) is not None


async def test_the_adapter_wires_a_watched_ca_file_into_tls_and_its_authenticator(tmp_path: Path) -> None:
    """`Adapter.serving_context` with a self-signed pair and a front-proxy CA file (security injected:
    enabling authentication for real needs Kubernetes for its reviews)."""
    ca_file = tmp_path / "front-proxy-ca.crt"
    ca_file.write_bytes(OLD_CA.cert_pem)
    config = Config.model_validate(
        {
            "prometheus": {"url": "http://127.0.0.1:1", "retries": 0},
            "adapter": {
                "authentication": {
                    "enabled": False,
                    "requestheader_client_ca_file": str(ca_file),
                    "requestheader_allowed_names": ["front-proxy-client"],
                }
            },
        }
    )
    adapter = Adapter(config, cert_reload_interval=3600)
    front_proxy = auth.RequestHeaderConfig(ca=certs(OLD_CA), allowed_names=("front-proxy-client",))

    async def deny(user: auth.UserInfo, attributes: Mapping[str, Any]) -> bool:
        return False

    adapter.security = Security(auth.Authenticator(front_proxy, (), None), deny)
    try:
        ctx = adapter.serving_context()
        reloader = adapter.certificates
        assert reloader is not None and reloader.cert_file is None
        authenticator = adapter.security.authenticator

        async def user(front: pki.KeyPair, stem: str) -> auth.UserInfo | None:
            _, server_end = handshake(ctx, client_context(cert=front, tmp=tmp_path / stem))
            return await authenticator.authenticate(server_end.getpeercert(binary_form=True), HEADERS)

        with pytest.raises(ssl.SSLError, match=VERIFY_FAILED):
            await user(NEW_FRONT, "before")
        staged = ca_file.with_suffix(".new")
        staged.write_bytes(OLD_CA.cert_pem + NEW_CA.cert_pem)
        staged.replace(ca_file)
        assert reloader.poll() is Outcome.SUCCESS
        assert (await user(NEW_FRONT, "after")) is not None
        assert (await user(OLD_FRONT, "old")) is not None
    finally:
        await adapter.stop()


# ------------------------------------------------------------------ CAs from the authentication ConfigMap


async def test_a_front_proxy_ca_rotated_in_the_configmap_is_trusted_after_the_next_read(
    tmp_path: Path,
) -> None:
    fetched = Fetched()
    s = Setup(tmp_path, fetched)
    await s.reloader.fetch()
    assert s.reloader.poll() is Outcome.UNCHANGED  # the same CA as read at start
    fetched.pem["requestheader"] = NEW_CA.cert_pem
    assert s.reloader.poll() is Outcome.UNCHANGED  # not read again yet
    with pytest.raises(ssl.SSLError, match=VERIFY_FAILED):
        await s.user(NEW_FRONT, "new-before")
    await s.reloader.fetch()
    assert s.reloader.poll() is Outcome.SUCCESS
    assert (await s.user(NEW_FRONT, "new-after")) is not None
    with pytest.raises(ssl.SSLError, match=VERIFY_FAILED):
        await s.user(OLD_FRONT, "old-after")
    assert reloads(s.registry, "success") == 1 and fetched.reads == 2


async def test_the_reload_loop_reads_the_configmap_every_interval(tmp_path: Path) -> None:
    fetched = Fetched()
    s = Setup(tmp_path, fetched)
    s.reloader.interval = 0.01
    fetched.pem["requestheader"] = NEW_CA.cert_pem
    loop = asyncio.create_task(s.reloader.run())
    try:
        for _ in range(300):
            if reloads(s.registry, "success") == 1:
                break
            await asyncio.sleep(0.01)
        assert (await s.user(NEW_FRONT, "new")) is not None and fetched.reads >= 1
    finally:
        loop.cancel()


@pytest.mark.parametrize("trouble", ["api-error", "key-missing"])
async def test_an_unreadable_configmap_keeps_the_previous_cas(
    tmp_path: Path, trouble: str, caplog: pytest.LogCaptureFixture
) -> None:
    fetched = Fetched()
    s = Setup(tmp_path, fetched)
    await s.reloader.fetch()
    if trouble == "api-error":
        fetched.error = KubeError("the server is currently unable to handle the request", status=503)
    else:
        fetched.pem = {}
    with caplog.at_level(logging.WARNING, logger="gpuwarden.certreload"):
        for _ in range(3):
            await s.reloader.fetch()
            assert s.reloader.poll() is Outcome.UNCHANGED
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == (1 if trouble == "api-error" else 0)  # a lasting failure is logged once
    if warnings:
        assert warnings[0].__dict__["source"] == SOURCE
    assert (await s.user(OLD_FRONT, "old")) is not None
    fetched.error, fetched.pem = None, {"requestheader": NEW_CA.cert_pem}  # it recovers with a new CA
    await s.reloader.fetch()
    assert s.reloader.poll() is Outcome.SUCCESS
    assert (await s.user(NEW_FRONT, "new")) is not None


async def test_invalid_cas_in_the_configmap_are_reported_with_their_source(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fetched = Fetched()
    s = Setup(tmp_path, fetched)
    fetched.pem["requestheader"] = b"garbage"
    with caplog.at_level(logging.ERROR, logger="gpuwarden.certreload"):
        await s.reloader.fetch()
        assert s.reloader.poll() is Outcome.INVALID
        await s.reloader.fetch()
        assert s.reloader.poll() is Outcome.UNCHANGED
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.__dict__["source"] == SOURCE and record.__dict__["kind"] == "requestheader"
    assert (await s.user(OLD_FRONT, "old")) is not None


class ConfigMaps:
    """`KubeClient.get` for the one ConfigMap the adapter reads (what `fetch_configmap_cas` calls)."""

    def __init__(self, data: dict[str, str]) -> None:
        self.data = data
        self.asked: list[tuple[str, str | None]] = []

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        self.asked.append((name, namespace))
        return {"data": dict(self.data)}


async def test_fetch_configmap_cas_reads_only_the_kinds_asked_for() -> None:
    kube = ConfigMaps(
        {
            "requestheader-client-ca-file": NEW_CA.cert_pem.decode(),
            "client-ca-file": CLIENT_CA.cert_pem.decode(),
        }
    )
    got = await auth.fetch_configmap_cas(cast(KubeClient, kube), ("requestheader",))
    assert got == {"requestheader": NEW_CA.cert_pem}
    assert kube.asked == [("extension-apiserver-authentication", "kube-system")]
    kube.data = {"client-ca-file": ""}
    assert await auth.fetch_configmap_cas(cast(KubeClient, kube), ("requestheader", "client")) == {}


async def test_the_adapter_rereads_the_configmap_cas_it_started_with(tmp_path: Path) -> None:
    """Without CA files the adapter trusts what the authentication ConfigMap held at start; its reloader
    re-reads the kinds that came from there."""
    config = Config.model_validate(
        {
            "prometheus": {"url": "http://127.0.0.1:1", "retries": 0},
            "adapter": {"authentication": {"enabled": False}},
        }
    )
    kube = ConfigMaps(
        {
            "requestheader-client-ca-file": OLD_CA.cert_pem.decode(),
            "client-ca-file": CLIENT_CA.cert_pem.decode(),
        }
    )
    adapter = Adapter(config, kube=cast(KubeClient, kube), cert_reload_interval=3600)
    front_proxy = auth.RequestHeaderConfig(ca=certs(OLD_CA), allowed_names=("front-proxy-client",))

    async def deny(user: auth.UserInfo, attributes: Mapping[str, Any]) -> bool:
        return False

    adapter.security = Security(auth.Authenticator(front_proxy, certs(CLIENT_CA), None), deny)
    try:
        ctx = adapter.serving_context()
        reloader = adapter.certificates
        assert reloader is not None
        authenticator = adapter.security.authenticator

        async def user(front: pki.KeyPair, stem: str) -> auth.UserInfo | None:
            _, server_end = handshake(ctx, client_context(cert=front, tmp=tmp_path / stem))
            return await authenticator.authenticate(server_end.getpeercert(binary_form=True), HEADERS)

        kube.data["requestheader-client-ca-file"] = NEW_CA.cert_pem.decode()
        await reloader.fetch()
        assert reloader.poll() is Outcome.SUCCESS
        assert (await user(NEW_FRONT, "after")) is not None
        alice = pki.issue(CLIENT_CA, "alice", client=True)
        assert (await user(alice, "alice")) == auth.UserInfo("alice")  # the client CA is still trusted
    finally:
        await adapter.stop()
