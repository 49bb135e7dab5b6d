"""Exposition: dcgm-exporter's names, types, HELP and labels exactly; parse-checked; exact cache and gzip."""

from __future__ import annotations

import gzip
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.simulator.compression import gzip_chunks
from harness.simulator.exposition import ALL_FAMILIES, Renderer, xid_message
from harness.simulator.fleet import Fleet, PodSpec
from harness.simulator.scenario import fault_adapter, parse_scenario
from harness.simulator.workload import LoadCurve

BASE_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
POD_LABELS = {"container", "namespace", "pod"}


def make(doc: dict[str, Any] | None = None) -> Fleet:
    base: dict[str, Any] = {
        "fleet": {"nodes": 2, "gpus_per_node": 4},
        "workloads": [{"name": "web", "namespace": "shop", "replicas": 1, "load": [{"at": 0, "qps": 50}]}],
    }
    return Fleet(parse_scenario({**base, **(doc or {})}), start=0.0)


def inject(fleet: Fleet, **doc: Any) -> None:
    fleet.apply_fault(fault_adapter.validate_python({"node": "gpu-node-000", "gpu": 0, **doc}), fleet.now)


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


@pytest.mark.parametrize(
    ("name", "type_", "help_"),
    [
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
        ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
        ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
        ("DCGM_EXP_XID_ERRORS_COUNT", "counter", "reported XIDs during last window"),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
        ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors."),
        ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors."),
        ("DCGM_FI_DEV_RETIRED_SBE", "counter", "Total number of retired pages due to single-bit errors."),
        ("DCGM_FI_DEV_RETIRED_DBE", "counter", "Total number of retired pages due to double-bit errors."),
        ("DCGM_FI_DEV_RETIRED_PENDING", "counter", "Total number of pages pending retirement."),
        (
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "counter",
            "Number of remapped rows for uncorrectable errors",
        ),
        (
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "counter",
            "Number of remapped rows for correctable errors",
        ),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
        ("http_requests", "counter", "Total HTTP requests served by the pod (simulated)."),
    ],
)
def test_family_names_types_and_help(name: str, type_: str, help_: str) -> None:
    fleet = make()
    inject(fleet, kind="xid", code=79)
    text = Renderer(fleet).render()
    family = families(text)[name]  # prometheus_client strips `_total` from counter family names
    assert (family.type, family.documentation) == (type_, help_)
    assert f"# TYPE {name if name != 'http_requests' else 'http_requests_total'} {type_}\n" in text


def test_every_gpu_has_one_series_per_family_with_exact_labels() -> None:
    fleet = make()
    fams = families(Renderer(fleet).render())
    for name in ALL_FAMILIES:
        if name == "DCGM_FI_DEV_XID_ERRORS":
            continue  # no XID yet: no series (dcgm-exporter skips blank values)
        samples = fams[name].samples
        assert len(samples) == 8, name
        held = [s.labels for s in samples if "pod" in s.labels]
        assert [(h["namespace"], h["pod"], h["container"]) for h in held] == [("shop", "web-0", "web")], name
        for s in samples:
            extra = {"window_size_in_ms"} if name == "DCGM_EXP_XID_ERRORS_COUNT" else set()
            assert set(s.labels) == BASE_LABELS | extra | (POD_LABELS if "pod" in s.labels else set()), name


def test_label_order_and_value_format_follow_the_exporter_template() -> None:
    fleet = make()
    fleet.set_load("shop", "web", LoadCurve.constant(87.5))
    text = Renderer(fleet).render()
    uuid = fleet.nodes["gpu-node-000"].gpus[0].uuid
    assert lines(text, "DCGM_FI_DEV_POWER_USAGE")[0] == (
        f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="{uuid}",pci_bus_id="00000000:18:00.0",device="nvidia0",'
        'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-000",DCGM_FI_DRIVER_VERSION="570.148.08",'
        'container="web",namespace="shop",pod="web-0"} 621.250000'
    )
    assert lines(text, "DCGM_FI_DEV_GPU_UTIL")[0].endswith(" 88")  # integer percent
    assert lines(text, "DCGM_FI_DEV_GPU_UTIL")[1].endswith(
        'Hostname="gpu-node-000",DCGM_FI_DRIVER_VERSION="570.148.08"} 0'
    )


def test_xid_series_carries_err_code_and_err_msg_and_sticks() -> None:
    fleet = make()
    inject(fleet, kind="xid", code=48)
    inject(fleet, kind="xid", code=79)
    fleet.advance(3600)
    text = Renderer(fleet).render()
    (line,) = lines(text, "DCGM_FI_DEV_XID_ERRORS")
    assert line.endswith(
        'DCGM_FI_DRIVER_VERSION="570.148.08",container="web",err_code="79",'
        'err_msg="GPU has fallen off the bus",namespace="shop",pod="web-0"} 79'
    )


def test_xid_count_has_one_series_per_code_in_the_window_else_a_zero_series() -> None:
    fleet = make()
    inject(fleet, kind="xid", code=13, count=2)
    inject(fleet, kind="xid", code=79)
    counts = lines(Renderer(fleet).render(), "DCGM_EXP_XID_ERRORS_COUNT")
    assert len(counts) == 9  # 2 series for GPU 0, one zero series for each of the other 7
    assert counts[0].endswith('pod="web-0",window_size_in_ms="300000",xid="13"} 2')
    assert counts[1].endswith('pod="web-0",window_size_in_ms="300000",xid="79"} 1')
    assert counts[2].endswith('DCGM_FI_DRIVER_VERSION="570.148.08",window_size_in_ms="300000"} 0')
    fleet.advance(301)
    assert len(lines(Renderer(fleet).render(), "DCGM_EXP_XID_ERRORS_COUNT")) == 8


def _families_of(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


@pytest.mark.parametrize(
    ("exporter", "check"),
    [
        pytest.param(
            {"hostname_label": "hostname"},
            lambda t: 'hostname="gpu-node-001"' in t and "Hostname" not in t,
            id="hostname-lowercase",
        ),
        pytest.param(
            {"kubernetes": False},
            lambda t: 'pod="' not in t.split("# HELP http_requests_total")[0],
            id="no-pod-labels",
        ),
        pytest.param(
            {"metrics": ["DCGM_FI_DEV_GPU_UTIL"]},
            lambda t: _families_of(t) == {"DCGM_FI_DEV_GPU_UTIL", "http_requests", "gateway_requests"},
            id="metric-subset",
        ),
        pytest.param(
            {"xid_zero_when_none": True},
            lambda t: len(lines(t, "DCGM_FI_DEV_XID_ERRORS")) == 8 and 'err_code="0",err_msg="No Error"' in t,
            id="xid-zero-series",
        ),
        pytest.param({"xid_count_window": "1m"}, lambda t: 'window_size_in_ms="60000"' in t, id="window"),
    ],
)
def test_exporter_options(exporter: dict[str, Any], check: Any) -> None:
    text = Renderer(make({"exporter": exporter})).render()
    assert check(text)
    text_string_to_metric_families(text)  # still parses


@pytest.mark.parametrize(
    ("doc", "gone", "left"),
    [
        pytest.param(
            {"kind": "exporter_down", "node": "gpu-node-000"}, "gpu-node-000", 4, id="exporter-down"
        ),
        pytest.param({"kind": "gpu_missing", "node": "gpu-node-000", "gpu": 0}, None, 7, id="gpu-missing"),
    ],
)
def test_missing_things_stop_exporting(doc: dict[str, Any], gone: str | None, left: int) -> None:
    fleet = make()
    fleet.apply_fault(fault_adapter.validate_python(doc), fleet.now)
    text = Renderer(fleet).render()
    assert len(lines(text, "DCGM_FI_DEV_GPU_UTIL")) == left
    if gone:
        assert f'Hostname="{gone}"' not in text
    assert lines(text, "http_requests_total")  # the pods' own metrics are not the exporter's


def test_per_node_render_has_only_that_node_and_no_app_metrics() -> None:
    text = Renderer(make()).render(node="gpu-node-001", apps=False)
    assert len(lines(text, "DCGM_FI_DEV_GPU_UTIL")) == 4
    assert "gpu-node-000" not in text and "http_requests_total" not in text


def test_app_metrics_per_pod() -> None:
    fleet = make()
    fleet.set_pods([PodSpec("shop", "web-x", "gpu-node-001", (2,), "web")], replace=False)
    fleet.advance(10)
    text = Renderer(fleet).render(dcgm=False)
    assert lines(text, "http_requests_total") == [
        'http_requests_total{code="200",method="GET",namespace="shop",pod="web-0"} 250',
        'http_requests_total{code="200",method="GET",namespace="shop",pod="web-x"} 250',
    ]


def test_gateway_series_per_workload_exists_while_no_pod_runs() -> None:
    fleet = make()
    fleet.set_load("serving", "cold", LoadCurve.constant(20, fleet.now))  # no pod: nothing serves it
    fleet.set_pods([PodSpec("train", "job-worker-0", "gpu-node-001", (0,), "job")], replace=False)
    fleet.advance(10)
    text = Renderer(fleet).render(dcgm=False)
    assert lines(text, "gateway_requests_total") == [
        'gateway_requests_total{namespace="serving",service="cold"} 200',
        'gateway_requests_total{namespace="shop",service="web"} 500',
    ]  # none for the training job: no load was ever set for it, no gateway stands in front of it
    assert families(text)["gateway_requests"].type == "counter"
    assert not any('pod="cold' in line for line in lines(text, "http_requests_total"))


def test_cadvisor_series_per_pod_follow_its_gpu_load_only_when_asked_for() -> None:
    assert not lines(Renderer(make()).render(dcgm=False), "container_cpu_usage_seconds_total")
    fleet = make({"exporter": {"cadvisor": True}})
    fleet.advance(10)  # web-0: 50 QPS on one GPU of 100 QPS -> 50 % -> 0.05 + 0.5 cores
    text = Renderer(fleet).render(dcgm=False)
    labels = '{container="web",namespace="shop",node="gpu-node-000",pod="web-0"}'
    assert lines(text, "container_cpu_usage_seconds_total") == [
        f"container_cpu_usage_seconds_total{labels} 5.500000"
    ]
    assert lines(text, "container_memory_working_set_bytes") == [
        f"container_memory_working_set_bytes{labels} {3 * 2**30}"  # 1 GiB + 2 GiB per GPU
    ]
    kinds = {f.name: f.type for f in families(text).values()}
    assert kinds["container_cpu_usage_seconds"] == "counter"
    assert kinds["container_memory_working_set_bytes"] == "gauge"


def test_block_cache_renders_exactly_what_a_fresh_renderer_does() -> None:
    fleet = make({"fleet": {"nodes": 70, "gpus_per_node": 8}})  # 560 GPUs: several cache blocks per family
    cached = Renderer(fleet)
    for step in range(1, 5):
        cached.render()
        fleet.advance(step)
        fleet.set_pods([PodSpec("shop", f"p{step}", "gpu-node-040", (step,), "web")], replace=False)
        inject(fleet, kind="ecc", error="sbe", node=f"gpu-node-0{step}5", gpu=step)
        assert cached.render() == Renderer(fleet).render(), step


def test_gzip_of_chunks_is_the_plain_body() -> None:
    renderer = Renderer(make({"fleet": {"nodes": 40, "gpus_per_node": 8}}))
    chunks = renderer.render_chunks()
    plain = b"".join(c.data for c in chunks)
    assert gzip.decompress(gzip_chunks(chunks)) == plain
    assert gzip.decompress(gzip_chunks(chunks)) == plain  # second time from the per-chunk cache
    assert all(c.gz is not None for c in chunks)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (0, "No Error"),
        (13, "Graphics Engine Exception"),
        (48, "Double Bit ECC Error"),
        (999, "Unknown Error"),
    ],
    ids=["none", "app", "dbe", "beyond-table"],
)
def test_xid_messages(code: int, text: str) -> None:
    assert xid_message(code) == text


def test_signal_series_follow_dcgm_exporter_shapes() -> None:
    from harness.simulator.fleet import Fleet
    from harness.simulator.scenario import fault_adapter, parse_scenario

    fleet = Fleet(parse_scenario({"fleet": {"nodes": 1, "gpus_per_node": 2}}), start=0.0)
    fleet.apply_fault(fault_adapter.validate_python(
        {"kind": "nvswitch", "node": "gpu-node-000", "sxid": 12, "switch": 1}), 0.0)  # fmt: skip
    text = Renderer(fleet).render()
    for name in ("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_GPU_TEMP_LIMIT"):  # fmt: skip
        assert len(lines(text, name)) == 2, name
    assert 'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS{nvswitch="1",Hostname="gpu-node-000"} 12' in text
    assert 'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS{nvswitch="0",Hostname="gpu-node-000"} 0' in text
    assert len(lines(text, "DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS")) == 4  # one per NVSwitch of the board
    assert "DCGM_FI_DEV_FABRIC_HEALTH_MASK{" in text and "} 426\n" in text  # 0x1AA: healthy


def test_pcie_only_card_has_no_nvlink_or_nvswitch_series() -> None:
    from harness.simulator.fleet import Fleet
    from harness.simulator.scenario import parse_scenario

    doc = {"fleet": {"nodes": 1, "gpus_per_node": 2, "gpu": {"model_name": "NVIDIA A100-PCIE-40GB",
                                                             "nvlink": False}}}  # fmt: skip
    text = Renderer(Fleet(parse_scenario(doc), start=0.0)).render()
    assert "NVLINK" not in text and "NVSWITCH" not in text
    assert all(
        line.endswith(" 0") for line in lines(text, "DCGM_FI_DEV_FABRIC_MANAGER_STATUS")
    )  # not supported
    assert all(line.endswith(" 0") for line in lines(text, "DCGM_FI_DEV_FABRIC_HEALTH_MASK"))
