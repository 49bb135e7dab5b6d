"""Golden wire-format tests: the exact JSON kube-scheduler sends and expects (kube-scheduler extender/v1).

The `compat_*` files are upstream's `TestCompatibility` strings: we must produce them byte for byte and, like
Go's case-insensitive decoder, read them back when lower-cased. The per-verb files are the requests of both
`nodeCacheCapable` modes; test_extender_server.py checks our answers to them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from controller.extenderv1 import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    HostPriorityList,
    MetaPod,
    MetaVictims,
    WireModel,
    encode_host_priorities,
)

GOLDEN = Path(__file__).parent / "golden" / "extender"

COMPAT: list[tuple[str, type[WireModel]]] = [
    ("ExtenderPreemptionResult", ExtenderPreemptionResult),
    ("ExtenderPreemptionArgs", ExtenderPreemptionArgs),
    ("ExtenderArgs", ExtenderArgs),
    ("ExtenderFilterResult", ExtenderFilterResult),
    ("ExtenderBindingArgs", ExtenderBindingArgs),
    ("ExtenderBindingResult", ExtenderBindingResult),
    ("HostPriority", HostPriority),
]


def golden(name: str) -> bytes:
    return (GOLDEN / name).read_bytes().strip()


@pytest.mark.parametrize(("name", "model"), COMPAT, ids=[c[0] for c in COMPAT])
def test_upstream_compatibility_round_trip(name: str, model: type[WireModel]) -> None:
    text = golden(f"compat_{name}.json")
    parsed = model.model_validate_json(text)
    assert parsed.to_json() == text
    lowered = model.model_validate_json(text.lower())
    assert lowered.to_json().lower() == text.lower()


def test_host_priority_list_is_a_bare_array() -> None:
    ranked = HostPriorityList([HostPriority(host="a", score=3), HostPriority(host="b", score=10)])
    assert ranked.to_json() == b'[{"Host":"a","Score":3},{"Host":"b","Score":10}]'
    assert HostPriorityList.model_validate_json(golden("prioritize_result.json")).to_json() == golden(
        "prioritize_result.json"
    )
    pairs = [("a", 3), ("b", 10), ("ü-node", 0), ('we"ird\\name', 7)]
    for _ in range(2):  # the second time from the cached per-host prefixes
        fast = encode_host_priorities(pairs)
        assert fast == HostPriorityList([HostPriority(host=h, score=s) for h, s in pairs]).to_json()
    assert encode_host_priorities([]) == HostPriorityList([]).to_json() == b"[]"


def test_unset_pointers_are_null_and_every_field_is_present() -> None:
    assert ExtenderFilterResult(error="topology cache not synced").to_json() == (
        b'{"Nodes":null,"NodeNames":null,"FailedNodes":null,"FailedAndUnresolvableNodes":null,'
        b'"Error":"topology cache not synced"}'
    )
    assert ExtenderPreemptionResult().to_json() == b'{"NodeNameToMetaVictims":null}'
    assert ExtenderBindingResult().to_json() == b'{"Error":""}'


@pytest.mark.parametrize(
    ("name", "cache_capable", "names"),
    [
        ("filter_args_cache.json", True, ["gpu-node-1", "gpu-node-2", "gpu-node-3"]),
        ("filter_args_nocache.json", False, ["gpu-node-1", "gpu-node-2", "gpu-node-3"]),
        ("prioritize_args_cache.json", True, ["gpu-node-1", "gpu-node-2", "gpu-node-3"]),
        ("prioritize_args_nocache.json", False, ["gpu-node-1", "gpu-node-2", "gpu-node-3"]),
    ],
)
def test_extender_args_in_both_cache_modes(name: str, cache_capable: bool, names: list[str]) -> None:
    args = ExtenderArgs.model_validate_json(golden(name))
    assert args.node_cache_capable is cache_capable
    assert args.candidate_names() == names
    assert args.pod["metadata"]["name"] == "train-0"
    doc = json.loads(golden(name))
    assert json.loads(args.to_json()) == doc  # nothing lost, nulls kept


def test_preemption_args_in_both_modes_give_the_same_uids_in_order() -> None:
    cache = ExtenderPreemptionArgs.model_validate_json(golden("preempt_args_cache.json"))
    full = ExtenderPreemptionArgs.model_validate_json(golden("preempt_args_nocache.json"))
    assert cache.node_name_to_victims is None and full.node_name_to_meta_victims is None
    assert cache.meta_victims() == full.meta_victims()
    assert full.meta_victims()["gpu-node-1"] == MetaVictims(
        pods=[MetaPod(uid="aaa-111"), MetaPod(uid="bbb-222")], num_pdb_violations=0
    )


def test_bind_args() -> None:
    args = ExtenderBindingArgs.model_validate_json(golden("bind_args.json"))
    assert (args.pod_name, args.pod_namespace, args.node) == ("train-0", "ml", "gpu-node-2")
    assert args.pod_uid.startswith("6f1c")


def test_unknown_keys_are_ignored_and_exact_case_wins() -> None:
    args = ExtenderBindingArgs.model_validate_json(
        b'{"PodName":"a","podname":"b","PodNamespace":"ns","PodUID":"u","Node":"n","Extra":1}'
    )
    assert args.pod_name == "a"


@pytest.mark.parametrize(
    ("model", "body", "problem"),
    [
        (ExtenderArgs, b'{"NodeNames":["a"]}', "Pod"),
        (ExtenderArgs, b'{"Pod":{},"NodeNames":"a"}', "NodeNames"),
        (ExtenderArgs, b"not json", "json"),
        (ExtenderBindingArgs, b'{"PodName":"a"}', "PodNamespace"),
        (ExtenderPreemptionArgs, b'{"Pod":{},"NodeNameToMetaVictims":{"n":{"Pods":[{"UID":1}]}}}', "UID"),
    ],
    ids=["missing-pod", "names-not-a-list", "not-json", "bind-missing-fields", "uid-not-a-string"],
)
def test_malformed_requests_are_rejected_naming_the_field(
    model: type[WireModel], body: bytes, problem: str
) -> None:
    with pytest.raises(ValidationError) as info:
        model.model_validate_json(body)
    assert problem.lower() in str(info.value).lower()
