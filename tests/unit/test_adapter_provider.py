"""Pure cores of the provider (`build_metric_values`, `values_by_object`) and the review shell's requests."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from adapter import auth, naming
from adapter.provider import build_metric_values, values_by_object
from adapter.registry import CustomMetric
from adapter.resources import GroupResource
from gpuwarden.config.metric_rules import DiscoveryRule
from gpuwarden.promtypes import Sample

RULE = naming.compile_rule(
    DiscoveryRule.model_validate({"seriesQuery": "x", "metricsQuery": "q"}), 0, external=False
)
PODS = CustomMetric("m", GroupResource("pods"), True, "x", RULE, "pod", "namespace")
NODES = CustomMetric("m", GroupResource("nodes"), False, "x", RULE, "node", None)
DEPLOYMENTS = CustomMetric(
    "m", GroupResource("deployments", "apps"), True, "x", RULE, "deployment", "namespace"
)
VALUES = {"b": (2.0, 10.0), "a": (1.0, 11.0), "nan": (math.nan, 10.0), "inf": (-math.inf, 10.0)}


@pytest.mark.parametrize(
    ("entry", "names", "expected"),
    [
        pytest.param(PODS, None, [("a", 1.0, 11.0), ("b", 2.0, 10.0)], id="all-sorted-non-finite-dropped"),
        pytest.param(PODS, ["b", "missing", "nan"], [("b", 2.0, 10.0)], id="requested-only"),
        pytest.param(PODS, [], [], id="nothing-requested"),
        pytest.param(NODES, ["a"], [("a", 1.0, 11.0)], id="root-scoped"),
    ],
)
def test_build_metric_values(
    entry: CustomMetric, names: list[str] | None, expected: list[tuple[str, float, float]]
) -> None:
    items = build_metric_values(entry, "ml", VALUES, names)
    assert [(ref["name"], value, ts) for ref, value, ts in items] == expected


@pytest.mark.parametrize(
    ("entry", "reference"),
    [
        pytest.param(PODS, {"kind": "Pod", "name": "a", "apiVersion": "v1", "namespace": "ml"}, id="pod"),
        pytest.param(NODES, {"kind": "Node", "name": "a", "apiVersion": "v1"}, id="node-no-namespace"),
        pytest.param(
            DEPLOYMENTS,
            {"kind": "Deployment", "name": "a", "apiVersion": "apps/v1", "namespace": "ml"},
            id="grouped-kind",
        ),
    ],
)
def test_described_object(entry: CustomMetric, reference: dict[str, str]) -> None:
    assert build_metric_values(entry, "ml", VALUES, ["a"])[0][0] == reference


def test_values_by_object_keeps_value_and_time_first_sample_wins_unlabelled_ignored() -> None:
    samples = [
        Sample({"pod": "a"}, 10, 1),
        Sample({"pod": "a"}, 10, 2),
        Sample({}, 10, 3),
        Sample({"pod": ""}, 10, 4),
        Sample({"pod": "b"}, 11, 5),
    ]
    assert values_by_object(samples, "pod") == {"a": (1, 10), "b": (5, 11)}


class FakeKube:
    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.posts.append((path, kwargs["body"]))
        if path.endswith("tokenreviews"):
            ok = kwargs["body"]["spec"]["token"] == "good"
            user = {"username": "u", "uid": "1", "groups": ["g"], "extra": {"k": ["v"]}}
            return {"status": {"authenticated": True, "user": user} if ok else {"authenticated": False}}
        return {"status": {"allowed": kwargs["body"]["spec"]["user"] == "u"}}


async def test_reviews_post_the_upstream_shapes_and_cache_answers() -> None:
    kube = FakeKube()
    reviews = auth.KubeReviews(kube, ttl=10)  # type: ignore[arg-type]
    user = await reviews.user_for_token("good")
    assert user == auth.UserInfo("u", ("g",), "1", {"k": ("v",)})
    assert await reviews.user_for_token("bad") is None
    assert await reviews.user_for_token("good") == user
    attributes = {"resourceAttributes": {"verb": "get", "resource": "pods"}}
    assert await reviews.allowed(user, attributes) is True
    assert await reviews.allowed(user, attributes) is True
    assert await reviews.allowed(auth.UserInfo("other"), attributes) is False
    paths = [p for p, _ in kube.posts]
    assert paths.count("/apis/authentication.k8s.io/v1/tokenreviews") == 2  # "good" answered from cache
    assert paths.count("/apis/authorization.k8s.io/v1/subjectaccessreviews") == 2
    sar = kube.posts[2][1]
    assert sar["kind"] == "SubjectAccessReview"
    assert sar["spec"] == {"user": "u", "groups": ["g"], "uid": "1", "extra": {"k": ["v"]}, **attributes}


class SlowKube(FakeKube):
    """Answers a review only when released, so several askers are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        await self.release.wait()
        return await super().request(method, path, **kwargs)


async def test_concurrent_askers_of_one_question_share_one_review() -> None:
    kube = SlowKube()
    reviews = auth.KubeReviews(kube, ttl=10)  # type: ignore[arg-type]
    same = {"resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "ml"}}
    other = {"resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "web"}}
    user = auth.UserInfo("u")
    asks = [asyncio.ensure_future(reviews.allowed(user, a)) for a in (same, same, same, other)]
    await asyncio.sleep(0)
    asks[0].cancel()  # a caller that goes away does not take the answer from the others
    kube.release.set()
    assert await asyncio.gather(*asks[1:]) == [True, True, True]
    assert len(kube.posts) == 2  # one per distinct question
    assert await reviews.allowed(user, same) is True  # then from the cache
    assert len(kube.posts) == 2
