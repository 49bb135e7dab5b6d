"""PrometheusClient request building, auth and typed results, against respx (no network).

What a real server can show is covered in tests/integration/test_promclient_real.py; here we check what goes
on the wire (GET vs POST, params, headers, auth) and that golden answers come back typed.
"""

from __future__ import annotations

import json
import os
import random
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
import respx
from prometheus_client import CollectorRegistry

from gpuwarden.config.prometheus import TLS, PrometheusConfig
from gpuwarden.errors import PrometheusError
from gpuwarden.promauth import build_ssl_context
from gpuwarden.promclient import PrometheusClient
from gpuwarden.promtypes import Matrix, Scalar, Vector

GOLDEN = Path(__file__).parent / "golden" / "prometheus"
BASE = "http://prom.test"


def golden(name: str) -> bytes:
    return (GOLDEN / f"{name}.json").read_bytes()


def ok(name: str, status: int = 200, **headers: str) -> httpx.Response:
    headers = {"Content-Type": "application/json", **headers}
    return httpx.Response(status, content=golden(name), headers=headers)


class FakeTime:
    """Clock + sleep for the client: sleeping advances the clock and is recorded, never waited."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def make_client(
    router: respx.MockRouter,
    fake: FakeTime | None = None,
    registry: CollectorRegistry | None = None,
    **config: Any,
) -> PrometheusClient:
    fake = fake or FakeTime()
    cfg = PrometheusConfig.model_validate({"url": BASE, **config})
    return PrometheusClient(
        cfg,
        registry=registry or CollectorRegistry(),
        transport=httpx.MockTransport(router.async_handler),
        clock=fake.clock,
        sleep=fake.sleep,
        rng=random.Random(7),
    )


@pytest.fixture
def router() -> respx.MockRouter:
    """Routes only; it answers through the client's injected MockTransport, nothing is patched."""
    return respx.MockRouter(assert_all_called=False)


def form(request: httpx.Request) -> dict[str, list[str]]:
    return parse_qs(request.content.decode())


def url_params(request: httpx.Request) -> dict[str, list[str]]:
    return parse_qs(request.url.query.decode())


async def test_post_sends_a_form_and_keeps_extra_params_in_the_url(router: respx.MockRouter) -> None:
    route = router.post(f"{BASE}/api/v1/query").mock(return_value=ok("vector_special_values"))
    async with make_client(router, method="POST", extra_query_params={"dedup": "true"}) as prom:
        result = await prom.query('DCGM_FI_DEV_GPU_UTIL{gpu="0"}', time=1795939230.0, timeout=10)
    request = route.calls.last.request
    assert request.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert form(request) == {
        "query": ['DCGM_FI_DEV_GPU_UTIL{gpu="0"}'],
        "time": ["1795939230.000"],
        "timeout": ["9.500"],  # a little less than ours, so Prometheus times out (and says so) first
    }
    assert url_params(request) == {"dedup": ["true"]}
    assert isinstance(result, Vector) and len(result.samples) == 4


async def test_get_puts_everything_in_the_url(router: respx.MockRouter) -> None:
    route = router.get(f"{BASE}/api/v1/query_range").mock(return_value=ok("matrix_range"))
    async with make_client(router, method="GET", extra_query_params={"nocache": "1"}) as prom:
        result = await prom.query_range("up", start=100, end=160, step=15, timeout=1)
    request = route.calls.last.request
    assert request.content == b""
    assert url_params(request) == {
        "query": ["up"],
        "start": ["100.000"],
        "end": ["160.000"],
        "step": ["15.000"],
        "timeout": ["0.900"],
        "nocache": ["1"],
    }
    assert isinstance(result, Matrix) and [p[1] for p in result.series[0].points] == [0, 12.5, 25, 37.5, 50]


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_series_sends_every_matcher(router: respx.MockRouter, method: str) -> None:
    route = router.route(url=f"{BASE}/api/v1/series").mock(return_value=ok("series"))
    async with make_client(router, method=method) as prom:
        series = await prom.series(["up", 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}'], start=10, end=20)
    request = route.calls.last.request
    sent = form(request) if method == "POST" else url_params(request)
    assert request.method == method
    assert sent == {
        "match[]": ["up", 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}'],
        "start": ["10.000"],
        "end": ["20.000"],
    }
    assert len(series) == 4 and series[0]["UUID"] == "GPU-0a"


async def test_label_values_is_get_even_when_post_is_configured(router: respx.MockRouter) -> None:
    route = router.get(f"{BASE}/api/v1/label/UUID/values").mock(return_value=ok("label_values"))
    router.post(f"{BASE}/api/v1/labels").mock(return_value=ok("labels"))
    async with make_client(router, method="POST") as prom:
        values = await prom.label_values("UUID", ["DCGM_FI_DEV_GPU_UTIL"])
        assert values == ["GPU-0a", "GPU-1b", "GPU-2c", "GPU-3d"]
        assert await prom.labels() == ["Hostname", "UUID", "__name__", "gpu"]
    assert url_params(route.calls.last.request) == {"match[]": ["DCGM_FI_DEV_GPU_UTIL"]}


async def test_path_prefix_url_params_and_static_headers_are_kept(router: respx.MockRouter) -> None:
    route = router.post("http://mimir.test/prometheus/api/v1/query").mock(return_value=ok("scalar"))
    async with make_client(
        router, url="http://mimir.test/prometheus?tenant_hint=a", headers={"X-Scope-OrgID": "team-gpu"}
    ) as prom:
        assert await prom.query("scalar(vector(2.5))") == Scalar(1795939200.0, 2.5)
    request = route.calls.last.request
    assert request.headers["X-Scope-OrgID"] == "team-gpu"
    assert request.headers["User-Agent"].startswith("gpuwarden/")
    assert url_params(request) == {"tenant_hint": ["a"]}


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("vector_special_values", lambda r: [str(s.value) for s in r.samples][1:] == ["nan", "inf", "-inf"]),
        ("vector_with_warnings", lambda r: r.warnings[0].startswith("partial response: store 10.0.0.7")),
        ("matrix_instant_range_selector", lambda r: isinstance(r, Matrix) and len(r.series[0].points) == 5),
        ("string", lambda r: r.value == "hello"),
    ],
    ids=["special-values", "warnings", "range-selector-is-matrix", "string"],
)
async def test_golden_answers_come_back_typed(router: respx.MockRouter, name: str, check: Any) -> None:
    router.post(f"{BASE}/api/v1/query").mock(return_value=ok(name))
    async with make_client(router) as prom:
        assert check(await prom.query("q"))


async def test_bearer_token_file_is_reread_only_when_it_changes(
    router: respx.MockRouter, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first-token\n")
    route = router.post(f"{BASE}/api/v1/query").mock(return_value=ok("scalar"))
    async with make_client(router, bearer_token_file=str(token)) as prom:
        await prom.query("1")
        await prom.query("1")
        auth = prom._http.auth
        assert route.calls[1].request.headers["Authorization"] == "Bearer first-token"
        assert auth.token.reads == 1  # type: ignore[union-attr]

        token.write_text("rotated-token\n")  # the kubelet rewrites projected tokens in place
        os.utime(token, ns=(1, 2_000_000_000))
        await prom.query("1")
        assert route.calls.last.request.headers["Authorization"] == "Bearer rotated-token"

        token.unlink()  # mid-swap: the last good token keeps working
        await prom.query("1")
        assert route.calls.last.request.headers["Authorization"] == "Bearer rotated-token"
        assert auth.token.reads == 2  # type: ignore[union-attr]


async def test_unreadable_token_file_raises_our_error_naming_the_file(
    router: respx.MockRouter, tmp_path: Path
) -> None:
    route = router.post(f"{BASE}/api/v1/query").mock(return_value=ok("scalar"))
    async with make_client(router, bearer_token_file=str(tmp_path / "missing")) as prom:
        with pytest.raises(PrometheusError, match=r"bearer token file .*missing"):
            await prom.query("1")
    assert not route.called


async def test_basic_auth_password_from_file(router: respx.MockRouter, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    route = router.post(f"{BASE}/api/v1/query").mock(return_value=ok("scalar"))
    basic = {"username": "gpuwarden", "password_file": str(password)}
    async with make_client(router, basic_auth=basic) as prom:
        await prom.query("1")
    assert route.calls.last.request.headers["Authorization"] == "Basic Z3B1d2FyZGVuOnMzY3JldA=="


def test_tls_context_loads_ca_and_client_certificate(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    cert, key = _self_signed(tmp_path)
    ctx = build_ssl_context(TLS(ca_file=cert, cert_file=cert, key_file=key))
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert any(c.get("subject") for c in ctx.get_ca_certs())
    insecure = build_ssl_context(TLS(insecure_skip_verify=True))
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname


def test_tls_files_that_cannot_be_loaded_raise_our_error(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(PrometheusError, match="cannot load TLS files"):
        build_ssl_context(TLS(ca_file=bad))


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuwarden-test")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def test_golden_files_are_valid_json() -> None:
    for path in GOLDEN.glob("*.json"):
        assert json.loads(path.read_bytes())["status"] in {"success", "error"}, path.name
