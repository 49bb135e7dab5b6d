"""NVLink domains in the GPU model: a node's domain is its whole clique label value, members carry their
GPUs and quarantine, unlabelled nodes are in no domain, and `gpuwarden plan` shows them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from controller.app import ControllerPlan
from controller.gpus.domains import domain_of_node, domain_rows, domains_of, node_domain
from gpuwarden.config import Config
from gpuwarden.config.domains import CLIQUE_LABEL
from tests.unit.extender_support import RESOURCE, node

RACK_A = "3183419e-9edc-4f0e-86e8-d895a9fb06be.17044"
RACK_B = "bbc2edac-0000-4f0e-86e8-d895a9fb06be.17044"  # same clique id, another cluster UUID (#377)


def tray(name: str, clique: str | None, gpus: int = 4, **kw: Any) -> dict[str, Any]:
    obj = node(name, gpus, **kw)
    if clique is not None:
        obj["metadata"]["labels"] = {CLIQUE_LABEL: clique}
    return obj


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({CLIQUE_LABEL: RACK_A}, RACK_A),
        ({}, None),
        ({CLIQUE_LABEL: ""}, None),
        ({"other/label": RACK_A}, None),
    ],
    ids=["labelled", "no-label", "empty-value", "other-key"],
)
def test_node_domain(labels: dict[str, str], expected: str | None) -> None:
    assert node_domain(labels, CLIQUE_LABEL) == expected


def test_domains_group_by_the_whole_label_value_not_the_clique_id() -> None:
    nodes = [tray("a-2", RACK_A), tray("a-1", RACK_A), tray("b-1", RACK_B), tray("plain", None, 8)]
    domains = domains_of(nodes, CLIQUE_LABEL, RESOURCE)
    assert list(domains) == [RACK_A, RACK_B]
    a = domains[RACK_A]
    assert a.nodes == ("a-1", "a-2") and a.gpus == 8
    assert (a.clique_id, a.cluster_uuid) == ("17044", RACK_A.split(".")[0])
    assert domains[RACK_B].nodes == ("b-1",)
    assert domain_of_node(nodes, CLIQUE_LABEL) == {"a-2": RACK_A, "a-1": RACK_A, "b-1": RACK_B}


def test_members_carry_quarantine_and_gpu_counts() -> None:
    nodes = [tray("a-1", RACK_A, taint="xid-79"), tray("a-2", RACK_A, gpus=0, topo=None)]
    (domain,) = domains_of(nodes, CLIQUE_LABEL, RESOURCE).values()
    assert [(m.node, m.gpus, m.quarantined) for m in domain.members] == [("a-1", 4, True), ("a-2", 0, False)]
    (row,) = domain_rows({domain.name: domain})
    assert (row["trays"], row["gpus"], row["quarantined_trays"]) == (2, 4, 1)


def test_the_label_key_is_configurable() -> None:
    custom = "example.com/rack"
    nodes = [tray("a-1", RACK_A)]
    nodes[0]["metadata"]["labels"] = {custom: "rack-7"}
    assert list(domains_of(nodes, custom, RESOURCE)) == ["rack-7"]
    assert domains_of(nodes, CLIQUE_LABEL, RESOURCE) == {}
    assert Config.model_validate({"domains": {"clique_label": custom}}).domains.clique_label == custom


def test_a_bad_label_key_names_the_field() -> None:
    with pytest.raises(ValidationError) as err:
        Config.model_validate({"domains": {"clique_label": "not a label!", "job_labels": ["ok/x", "-bad"]}})
    text = str(err.value)
    assert "domains.clique_label" in text and "domains.job_labels.1" in text


def test_plan_shows_domains_as_json_and_table() -> None:
    nodes = [tray(f"a-{i}", RACK_A, taint="xid-79" if i == 0 else None) for i in range(3)]
    rows = domain_rows(domains_of(nodes, CLIQUE_LABEL, RESOURCE))
    plan = ControllerPlan({}, "", {"clear": [], "evict": [], "hold": []}, nvlink_domains=rows)
    assert plan.to_dict()["nvlink_domains"] == rows
    table = plan.render_table()
    assert table.startswith("NVLINK DOMAINS")
    assert f"{RACK_A}: 3 trays, 12 GPUs, 1 quarantined" in table and "a-0, a-1, a-2" in table
    empty = ControllerPlan({}, "", {"clear": [], "evict": [], "hold": []})
    assert "NVLINK DOMAINS" not in empty.render_table()
