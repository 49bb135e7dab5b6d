"""`gpuwarden keda convert`: which prometheus triggers become gpuwarden triggers, with what, and why not."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter.kedaconvert import (
    Matcher,
    NotCovered,
    Options,
    Query,
    convert_documents,
    convert_query,
    parse_query,
)
from adapter.kedascaler import keda_presets, parse_trigger
from gpuwarden.cli import main
from gpuwarden.config.adapter import Presets

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "keda" / "scaledobjects-prometheus.yaml"
PRESETS = Presets()


@pytest.mark.parametrize(
    ("promql", "query"),
    [
        pytest.param(
            'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ml", modelName="A100"})',
            Query(
                "avg",
                "DCGM_FI_DEV_GPU_UTIL",
                (Matcher("namespace", "=", "ml"), Matcher("modelName", "=", "A100")),
            ),
            id="gauge",
        ),
        pytest.param(
            " sum ( rate ( http_requests_total { namespace = 'ml' , code !~ \"5..\" , } [2m] ) ) ",
            Query(
                "sum",
                "http_requests_total",
                (Matcher("namespace", "=", "ml"), Matcher("code", "!~", "5..")),
                120.0,
            ),
            id="rate-spaces-quotes-trailing-comma",
        ),
        pytest.param("max(up)", Query("max", "up", ()), id="no-matchers"),
        pytest.param(
            'min(x{a="b,c}",d!="e\\"f"})',
            Query("min", "x", (Matcher("a", "=", "b,c}"), Matcher("d", "!=", 'e"f'))),
            id="commas-braces-escapes-in-values",
        ),
        pytest.param("sum(rate(x[1h]))", Query("sum", "x", (), 3600.0), id="hours"),
    ],
)
def test_parse_query(promql: str, query: Query) -> None:
    assert parse_query(promql) == query


@pytest.mark.parametrize(
    "promql",
    [
        pytest.param("sum(x) by (pod)", id="grouping"),
        pytest.param("sum(x) / 2", id="arithmetic"),
        pytest.param("count(x)", id="other-aggregation"),
        pytest.param("sum(irate(x[2m]))", id="irate"),
        pytest.param("x", id="no-aggregation"),
        pytest.param('sum(x{a="b" c="d"})', id="broken-matchers"),
    ],
)
def test_queries_outside_the_subset_are_not_covered(promql: str) -> None:
    with pytest.raises(NotCovered):
        parse_query(promql)


@pytest.mark.parametrize(
    ("promql", "namespace", "metadata"),
    [
        pytest.param(
            'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ml"})',
            "ml",
            {"preset": "gpu-utilization", "aggregation": "avg"},
            id="gpu-same-namespace",
        ),
        pytest.param(
            'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ml",modelName="A100",gpu!="7"})',
            "other",
            {
                "preset": "gpu-utilization",
                "aggregation": "avg",
                "namespace": "ml",
                "metricLabelSelector": "modelName=A100,gpu!=7",
            },
            id="gpu-other-namespace-series-labels",
        ),
        pytest.param(
            'sum(rate(http_requests_total{namespace="ml",code="200"}[120s]))',
            "ml",
            {"preset": "qps", "metricLabelSelector": "code=200"},
            id="qps-window-in-seconds",
        ),
    ],
)
def test_convert_query(promql: str, namespace: str, metadata: dict[str, str]) -> None:
    conversion = convert_query(promql, PRESETS, namespace)
    assert conversion.metadata == metadata
    # what we write is what the external scaler accepts
    parse_trigger({**conversion.metadata, "targetValue": "1"}, namespace, keda_presets(PRESETS))


@pytest.mark.parametrize(
    ("promql", "presets", "reason"),
    [
        pytest.param(
            'sum(DCGM_FI_DEV_GPU_UTIL{namespace="ml"})', {}, "sum() over GPUs has no equal", id="gpu-sum"
        ),
        pytest.param("avg(DCGM_FI_DEV_GPU_UTIL)", {}, "not limited to one namespace", id="all-namespaces"),
        pytest.param(
            'avg(DCGM_FI_DEV_GPU_UTIL{namespace=~"ml|prod"})', {}, "one namespace per trigger", id="ns-regex"
        ),
        pytest.param(
            'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ml",pod="vllm-0"})',
            {},
            "selects pods by name",
            id="pod-name",
        ),
        pytest.param(
            'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ml",modelName=~"A.*"})', {}, "regex matcher", id="regex"
        ),
        pytest.param(
            'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ml",modelName="NVIDIA A100"})',
            {},
            "not a valid label selector",
            id="value-with-space",
        ),
        pytest.param(
            'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ml"})',
            {"gpu_utilization": {"source": "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}},
            "does not serve DCGM_FI_DEV_GPU_UTIL",
            id="gpu-preset-other-source",
        ),
        pytest.param(
            'sum(rate(http_requests_total{namespace="ml"}[5m]))', {}, "rate window 300s differs", id="window"
        ),
        pytest.param(
            'avg(rate(http_requests_total{namespace="ml"}[2m]))',
            {},
            "avg() of rates has no equal",
            id="qps-avg",
        ),
        pytest.param(
            'sum(rate(http_requests_total{namespace="ml"}[2m]))',
            {"requests_per_second": {"enabled": False}},
            "requests_per_second is disabled",
            id="qps-disabled",
        ),
        pytest.param(
            'sum(http_requests_total{namespace="ml"})', {}, "no gpuwarden preset serves", id="no-rate"
        ),
        pytest.param('sum(vllm:num_requests_waiting{namespace="ml"})', {}, "no gpuwarden preset", id="other"),
    ],
)
def test_not_covered_with_the_reason(promql: str, presets: dict[str, Any], reason: str) -> None:
    with pytest.raises(NotCovered, match=re.escape(reason)):
        convert_query(promql, Presets.model_validate(presets), "ml")


def scaled_object(*triggers: dict[str, Any], namespace: str = "ml") -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "so", "namespace": namespace},
        "spec": {"scaleTargetRef": {"name": "d"}, "triggers": list(triggers)},
    }


GPU_TRIGGER = {
    "type": "prometheus",
    "name": "gpu",
    "metricType": "Value",
    "useCachedMetrics": True,
    "authenticationRef": {"name": "prom-auth"},
    "metadata": {
        "serverAddress": "http://prom:9090",
        "query": 'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ml"})',
        "threshold": "70.5",
        "activationThreshold": "5",
        "ignoreNullValues": "false",
    },
}


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        pytest.param(
            Options(),
            {
                "type": "external",
                "name": "gpu",
                "metricType": "Value",
                "useCachedMetrics": True,
                "metadata": {
                    "scalerAddress": "gpuwarden-keda.gpuwarden.svc:6000",
                    "preset": "gpu-utilization",
                    "aggregation": "avg",
                    "targetValue": "70.5",
                    "activationThreshold": "5",
                    "enableTLS": "true",
                },
            },
            id="defaults-prometheus-auth-dropped",
        ),
        pytest.param(
            Options(scaler_address="gw:7000", auth_ref="gw-mtls", push=True, transport="tls-unverified"),
            {
                "type": "external-push",
                "name": "gpu",
                "metricType": "Value",
                "useCachedMetrics": True,
                "metadata": {
                    "scalerAddress": "gw:7000",
                    "preset": "gpu-utilization",
                    "aggregation": "avg",
                    "targetValue": "70.5",
                    "activationThreshold": "5",
                    "enableTLS": "true",
                    "unsafeSsl": "true",
                },
                "authenticationRef": {"name": "gw-mtls"},
            },
            id="push-mtls-unverified",
        ),
        pytest.param(
            Options(transport="plaintext"),
            {
                "type": "external",
                "name": "gpu",
                "metricType": "Value",
                "useCachedMetrics": True,
                "metadata": {
                    "scalerAddress": "gpuwarden-keda.gpuwarden.svc:6000",
                    "preset": "gpu-utilization",
                    "aggregation": "avg",
                    "targetValue": "70.5",
                    "activationThreshold": "5",
                },
            },
            id="plaintext",
        ),
    ],
)
def test_convert_documents_rewrites_the_trigger(options: Options, expected: dict[str, Any]) -> None:
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    cpu = {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "60"}}
    docs = [other, scaled_object(GPU_TRIGGER, cpu), None]
    out, reports = convert_documents(docs, PRESETS, options)
    assert out[0] == other and out[2] is None
    assert out[1]["spec"]["triggers"] == [expected, cpu]
    assert docs[1]["spec"]["triggers"][0] is GPU_TRIGGER, "the input is not modified"
    assert [(r.scaled_object, r.index, r.converted) for r in reports] == [("ScaledObject ml/so", 0, True)]
    notes = reports[0].notes
    assert any("same number of GPUs" in n for n in notes)
    assert any("authenticationRef (for Prometheus) was dropped" in n for n in notes) == (
        options.auth_ref is None
    )


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        pytest.param({"threshold": "1"}, "no metadata.query", id="no-query"),
        pytest.param(
            {"query": 'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ml"})'}, "threshold None", id="no-threshold"
        ),
        pytest.param(
            {"query": 'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ml"})', "threshold": "0"}, "above 0", id="zero"
        ),
        pytest.param(
            {
                "query": 'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ml"})',
                "threshold": "1",
                "activationThreshold": "x",
            },
            "activationThreshold 'x'",
            id="bad-activation",
        ),
    ],
)
def test_malformed_prometheus_triggers_are_kept(metadata: dict[str, Any], reason: str) -> None:
    trigger = {"type": "prometheus", "metadata": metadata}
    out, reports = convert_documents([scaled_object(trigger)], PRESETS, Options())
    assert out[0]["spec"]["triggers"] == [trigger]
    assert not reports[0].converted and reason in reports[0].message


def test_cli_converts_the_example_and_reports_every_prometheus_trigger(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["keda", "convert", str(EXAMPLE), "--auth-ref", "gw-mtls"]) == 0
    captured = capsys.readouterr()
    docs = list(yaml.safe_load_all(captured.out))
    types = [[t["type"] for t in d["spec"]["triggers"]] for d in docs]
    assert types == [["external", "external", "prometheus", "prometheus"], ["prometheus", "cpu"]]
    lines = captured.err.splitlines()
    assert [line.split(": ")[1] for line in lines] == ["converted", "converted", "kept", "kept", "kept"]
    assert "ScaledObject web/api trigger 0: kept: rate window 300s differs" in lines[4]
    assert main(["keda", "convert", str(EXAMPLE), "--strict"]) == 1


def test_cli_reads_stdin_and_rejects_unreadable_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(scaled_object(GPU_TRIGGER))))
    assert main(["keda", "convert", "-", "--transport", "plaintext", "--strict"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["spec"]["triggers"][0]["metadata"]["preset"] == "gpu-utilization"
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [b\n")
    assert main(["keda", "convert", str(bad)]) == 1
    assert "cannot read" in capsys.readouterr().err
    config = tmp_path / "config.yaml"
    config.write_text("adapter:\n  presets:\n    gpu_utilization:\n      enabled: false\n")
    assert main(["keda", "convert", str(EXAMPLE), "--config", str(config)]) == 0
    assert "kept: adapter.presets.gpu_utilization does not serve" in capsys.readouterr().err
