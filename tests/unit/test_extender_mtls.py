"""The extender's port authenticated (issue 44): which paths need a client certificate (a table), the
config that turns it on (errors name the field), and real TLS sockets with a generated CA: the scheduler's
client certificate is served on both HTTP paths, a caller without one - or with one of another CA - is
refused the verbs while the probes and /metrics answer it; a rotated client CA and serving pair are taken
without a restart; the forwarding client presents this replica's certificate."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from controller.extender.bind import Binder
from controller.extender.fastpath import LeanSite
from controller.extender.forward import Forwarder
from controller.extender.metrics import extender_metrics
from controller.extender.peerauth import admitted, needs_certificate
from controller.extender.runtime import Extender
from controller.extender.server import ExtenderService
from controller.extender.tlsport import ExtenderTls, ForwardingClient, extender_tls, tls_metrics
from controller.gpus.fit import Settings
from gpuwarden.certreload import Outcome
from gpuwarden.cli import main
from gpuwarden.config.extender import ExtenderConfig, ExtenderTLS
from gpuwarden.errors import ConfigError
from tests.pki import CA
from tests.unit.extender_support import FakePodApi, model, node, pod
from tests.unit.test_extender_fastpath import GET_HEALTHZ, exchange, handed_off, post
from tests.unit.test_extender_forward import NOW, Lease, bind_args
from tests.unit.test_extender_server import build, golden

PREFIX = "/gpuwarden"


@pytest.mark.parametrize(
    ("path", "prefix", "needs"),
    [
        pytest.param("/gpuwarden/filter", PREFIX, True, id="filter"),
        pytest.param("/gpuwarden/prioritize", PREFIX, True, id="prioritize"),
        pytest.param("/gpuwarden/preempt", PREFIX, True, id="preempt"),
        pytest.param("/gpuwarden/bind", PREFIX, True, id="bind"),
        pytest.param("/gpuwarden/bind/forwarded", PREFIX, True, id="bind-forwarded"),
        pytest.param("/gpuwarden/unknown", PREFIX, True, id="unknown-below-prefix"),
        pytest.param("/gpuwarden", PREFIX, True, id="prefix-itself"),
        pytest.param("/gpuwarden/", "/gpuwarden/", True, id="prefix-with-slash"),
        pytest.param("/gpuwardenx/filter", PREFIX, False, id="prefix-is-not-a-string-prefix"),
        pytest.param("/healthz", PREFIX, False, id="liveness"),
        pytest.param("/livez", PREFIX, False, id="livez"),
        pytest.param("/readyz", PREFIX, False, id="readiness"),
        pytest.param("/metrics", PREFIX, False, id="metrics"),
        pytest.param("/filter", "", True, id="no-prefix-verb"),
        pytest.param("/bind/forwarded", "/", True, id="root-prefix-forwarded"),
        pytest.param("/healthz", "", False, id="no-prefix-probe"),
        pytest.param("/metrics", "/", False, id="root-prefix-metrics"),
    ],
)
def test_which_paths_need_a_client_certificate(path: str, prefix: str, needs: bool) -> None:
    assert needs_certificate(path, prefix) is needs


@pytest.mark.parametrize(
    ("path", "required", "verified", "answered"),
    [
        pytest.param("/gpuwarden/bind", True, True, True, id="verb-verified"),
        pytest.param("/gpuwarden/bind", True, False, False, id="verb-without-certificate"),
        pytest.param("/gpuwarden/bind", False, False, True, id="verb-not-required"),
        pytest.param("/metrics", True, False, True, id="metrics-without-certificate"),
        pytest.param("/readyz", True, False, True, id="probe-without-certificate"),
    ],
)
def test_a_request_is_answered(path: str, required: bool, verified: bool, answered: bool) -> None:
    assert admitted(path, PREFIX, required=required, verified=verified) is answered


@pytest.mark.parametrize(
    ("tls", "field"),
    [
        pytest.param({"client_ca_file": "/ca.crt"}, "client_ca_file", id="client-ca-without-a-pair"),
        pytest.param({"cert_file": "/tls.crt"}, "key_file", id="cert-without-key"),
    ],
)
def test_config_errors_name_the_field(tls: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        ExtenderConfig.model_validate({"tls": tls})


@pytest.mark.parametrize(
    ("tls", "required"),
    [
        pytest.param({"cert_file": "/c", "key_file": "/k"}, False, id="serving-only"),
        pytest.param({"cert_file": "/c", "key_file": "/k", "client_ca_file": "/ca"}, True, id="mtls"),
        pytest.param(
            {
                "cert_file": "/c",
                "key_file": "/k",
                "client_ca_file": "/ca",
                "require_client_certificate": False,
            },
            False,
            id="optional",
        ),
    ],
)
def test_client_certificates_are_required_with_a_client_ca(tls: dict[str, Any], required: bool) -> None:
    assert ExtenderTLS.model_validate(tls).client_auth_required() is required


# ----------------------------------------------------------------------------------------- real sockets
@dataclass
class Pki:
    ca: CA
    directory: Path
    scheduler: ssl.SSLContext
    anonymous: ssl.SSLContext
    stranger: ssl.SSLContext

    def tls(self, **extra: Any) -> ExtenderTLS:
        d = self.directory
        return ExtenderTLS.model_validate(
            {"cert_file": d / "tls.crt", "key_file": d / "tls.key", "client_ca_file": d / "ca.crt", **extra}
        )


def client(ca: CA, issuer: CA | None, name: str, directory: Path) -> ssl.SSLContext:
    """A client trusting `ca`'s servers, presenting a certificate of `issuer` (None: none)."""
    context = ssl.create_default_context(cadata=ca.pem.decode())
    if issuer is not None:
        cert, key = issuer.issue(name, server=False)
        (directory / f"{name}.crt").write_bytes(cert)
        (directory / f"{name}.key").write_bytes(key)
        context.load_cert_chain(directory / f"{name}.crt", directory / f"{name}.key")
    return context


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = CA.new("extender-ca")
    cert, key = ca.issue("localhost", server=True, client_too=True)  # also the forwarding client's
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    (tmp_path / "ca.crt").write_bytes(ca.pem)
    return Pki(
        ca,
        tmp_path,
        scheduler=client(ca, ca, "kube-scheduler", tmp_path),
        anonymous=client(ca, None, "anonymous", tmp_path),
        stranger=client(ca, CA.new("stranger-ca"), "stranger", tmp_path),
    )


@dataclass
class Served:
    port: int
    site: web.TCPSite
    runner: web.AppRunner
    tls: ExtenderTls
    registry: CollectorRegistry


@pytest.fixture(params=[True, False], ids=["lean", "aiohttp"])
async def served(request: pytest.FixtureRequest, pki: Pki) -> AsyncIterator[Served]:
    service, _, registry = build()
    tls = extender_tls(pki.tls(), tls_metrics(registry))
    assert tls is not None
    extender = Extender(service.model, service, None, None, PREFIX, tls=tls)  # type: ignore[arg-type]
    app = web.Application()
    extender.mount(app)

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/healthz", ok)
    app.router.add_get("/metrics", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = extender.site(runner, "127.0.0.1", 0, lean=request.param)
    await site.start()
    yield Served(site.port, site, runner, tls, registry)
    await runner.cleanup()


FILTER = post(f"{PREFIX}/filter", golden("filter_args_cache.json"))
BIND = post(f"{PREFIX}/bind", golden("bind_args.json"))
GET_METRICS = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def refusals(served: Served) -> float:
    value = served.registry.get_sample_value("gpuwarden_extender_client_certificate_refusals_total")
    return value or 0.0


async def test_the_schedulers_certificate_is_served_the_verbs(served: Served, pki: Pki) -> None:
    answers = await exchange(served.port, FILTER, FILTER, GET_HEALTHZ, ssl_context=pki.scheduler)
    assert [a.status for a in answers] == [200, 200, 200]
    assert answers[0].body == golden("filter_result_cache.json")
    if isinstance(served.site, LeanSite):
        assert handed_off(served) == 1  # filter twice on the lean path, then the probe: aiohttp's


async def test_a_caller_without_a_certificate_gets_the_probes_and_metrics_but_no_verb(
    served: Served, pki: Pki
) -> None:
    answers = await exchange(served.port, GET_HEALTHZ, GET_METRICS, FILTER, BIND, ssl_context=pki.anonymous)
    assert [a.status for a in answers] == [200, 200, 403, 403]
    assert refusals(served) == 2
    if isinstance(served.site, LeanSite):
        assert handed_off(served) == 1  # aiohttp's from the first byte: the lean path answers no verb
    first = await exchange(served.port, BIND, ssl_context=pki.anonymous)  # a verb as the first request
    assert first[0].status == 403


async def test_a_certificate_of_another_ca_fails_the_handshake(served: Served, pki: Pki) -> None:
    with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError)):
        await exchange(served.port, GET_HEALTHZ, ssl_context=pki.stranger)


async def test_a_rotated_client_ca_is_trusted_without_a_restart(served: Served, pki: Pki) -> None:
    new_ca = CA.new("rotated-ca")
    (pki.directory / "ca.crt").write_bytes(pki.ca.pem + new_ca.pem)  # both, during the rotation
    assert served.tls.reloader.poll() is Outcome.SUCCESS
    rotated = client(pki.ca, new_ca, "scheduler-2", pki.directory)
    answers = await exchange(served.port, FILTER, ssl_context=rotated)
    assert [a.status for a in answers] == [200]
    (pki.directory / "ca.crt").write_bytes(new_ca.pem)  # the old CA retired
    assert served.tls.reloader.poll() is Outcome.SUCCESS
    with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError)):
        await exchange(served.port, FILTER, ssl_context=pki.scheduler)


async def test_the_forwarding_client_presents_this_replicas_certificate(served: Served, pki: Pki) -> None:
    answers = await exchange(served.port, FILTER, ssl_context=served.tls.client_context())
    assert [a.status for a in answers] == [200]
    old = served.tls.client_context()
    cert, key = pki.ca.issue("localhost", server=True, client_too=True)  # a rotated pair
    (pki.directory / "tls.crt").write_bytes(cert)
    (pki.directory / "tls.key").write_bytes(key)
    assert served.tls.reloader.poll() is Outcome.SUCCESS
    assert served.tls.client_context() is not old
    answers = await exchange(served.port, FILTER, ssl_context=served.tls.client_context())
    assert [a.status for a in answers] == [200]


def test_an_unreadable_client_ca_file_is_a_config_error_naming_it(pki: Pki) -> None:
    (pki.directory / "ca.crt").write_bytes(b"not a certificate")
    with pytest.raises(ConfigError) as caught:
        extender_tls(pki.tls(), tls_metrics(None))
    assert caught.value.problems[0][0] == "extender.tls.client_ca_file"


async def test_a_forwarded_bind_needs_the_replicas_client_certificate(pki: Pki) -> None:
    """Leader bind protocol: the follower forwards bind to the binder's `bind/forwarded`, a verb like the
    others; with this replica's pair (`ExtenderTls.client_context`) it is bound, without a certificate the
    binder answers 403 and the scheduler gets an Error to retry on."""
    api = FakePodApi([pod("p0", 2), pod("p1", 1)])
    registry = CollectorRegistry()
    m = model([node("n")], api.pods.values())
    lease = Lease(True)
    binder = Binder(api, m, lambda: Settings(fleet_max_numa_gpus=4), clock=lambda: NOW, sole=lease)
    service = ExtenderService(m, Settings(), extender_metrics(registry), binder=binder, clock=lambda: NOW)
    service.is_binder = lease.fenced
    tls = extender_tls(pki.tls(), tls_metrics(registry))
    assert tls is not None
    extender = Extender(m, service, None, None, PREFIX, tls=tls)  # type: ignore[arg-type]
    app = web.Application()
    extender.mount(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = extender.site(runner, "127.0.0.1", 0, lean=True)
    await site.start()
    url = f"https://127.0.0.1:{site.port}{PREFIX}"
    with_certificate = Forwarder(lambda: url, own_url="elsewhere", timeout=5, ssl_context=tls.client_context)
    without = Forwarder(lambda: url, own_url="elsewhere", timeout=5, ssl_context=pki.anonymous)
    try:
        refused = await without.bind(bind_args("p1"))
        bound = await with_certificate.bind(bind_args("p0"))
    finally:
        await with_certificate.close()
        await without.close()
        await runner.cleanup()
    assert "answered 403" in refused.error
    assert bound.error == ""
    assert [c.split()[0] for c in api.calls] == ["bind"]  # only the certified forward was bound


async def test_without_client_cas_a_replica_trusts_its_own_ca_issued_leaf(pki: Pki) -> None:
    """TLS without client certificates: the forwarding client trusts exactly the serving certificate the
    replicas share, though a CA issued it (a partial chain), and no other."""
    service, _, registry = build()
    tls = extender_tls(pki.tls(client_ca_file=None), tls_metrics(registry))
    assert tls is not None and not tls.required
    extender = Extender(service.model, service, None, None, PREFIX, tls=tls)  # type: ignore[arg-type]
    app = web.Application()
    extender.mount(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = extender.site(runner, "127.0.0.1", 0, lean=True)
    await site.start()
    try:
        answers = await exchange(site.port, FILTER, ssl_context=tls.client_context())
        assert [a.status for a in answers] == [200]
        other = CA.new("other").issue("localhost", server=True, client_too=True)
        stranger = ForwardingClient(other, ())
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            await exchange(site.port, FILTER, ssl_context=stranger.context)
    finally:
        await runner.cleanup()


def test_the_controller_names_an_unusable_client_ca_file_and_exits(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (pki.directory / "ca.crt").write_bytes(b"not a certificate")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
    )
    d = pki.directory
    config = tmp_path / "config.yaml"
    config.write_text(
        f"kubernetes: {{kubeconfig: {kubeconfig}}}\n"
        f"extender: {{tls: {{cert_file: {d / 'tls.crt'}, key_file: {d / 'tls.key'}, "
        f"client_ca_file: {d / 'ca.crt'}}}}}\n"
    )
    assert main(["controller", "--config", str(config)]) == 1
    assert "extender.tls.client_ca_file: not a readable PEM CA bundle" in capsys.readouterr().err
