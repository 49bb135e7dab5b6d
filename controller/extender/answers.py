"""Filter and prioritize answers per node, pre-encoded: a request's answer is a join of cached bytes.

The only way the extender derives a filter or prioritize answer (`ExtenderService.filter` and
`prioritize` call nothing else): answers are cached where they may be and built for the request where not,
so one route serves every request - nodeCacheCapable or Nodes mode, a pod with or without GPUs, a
preemptor whose victims the watch may not have seen go (`may_be_settling` is the one settle rule).

Why it exists: kube-scheduler asks about 500 candidate nodes per pod, twice (filter, then prioritize), and a
node's answer for a request shape changes only when the node does. So each node's answer for a shape
(GPU count, topology-policy annotation) is derived once - from fit.py's verdicts, exactly as `filter_nodes`
and `score_nodes` derive it - and kept as JSON fragments: the node's name for `NodeNames`, `"name":"reason"`
for `FailedNodes` or `FailedAndUnresolvableNodes`, `{"Host":"name","Score":n}` for prioritize. A request
then costs one dictionary lookup per candidate and a join, instead of the per-candidate Python work.

What may be kept: answers that depend on nothing but the node's view, the shape and the settings - views
without claims (their answers would depend on the clock), nominations or preemption victims (on the
incoming pod's identity and priority), nodes with this replica's in-flight claims (`hot`, answered from an
overlaid view) and known nodes only. Everything else is derived per request, as before. An entry goes when
its node's view is dropped (`ClusterModel.add_change_listener`) and all of them when the settings object
changes.

It decides nothing itself (fit.py's `assess` and `choose_gpus` do) and does no I/O; its answers are held to
fit.py's `filter_nodes`, `score_nodes` and `explain_room` as an oracle (tests/unit/test_extender_answers.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from itertools import compress
from json.encoder import encode_basestring
from operator import countOf, itemgetter, not_
from typing import NamedTuple

from controller.gpus.domains import JobGroup, domain_refusal, placement_score
from controller.gpus.fit import FilterResult, FitVerdict, Settings, assess, choose_gpus
from controller.gpus.model import NodeView
from controller.gpus.objects import PodInfo
from controller.gpus.victims import explain_room

PASSED, DRA, FAILED, UNRESOLVABLE, FRAGMENTED, SHARED = range(6)
"""`Answer.kind`: passed, passed through (DRA-backed), failed (preemption may help), unresolvable,
unresolvable because fragmented (`explain_room` completes its reason per request), and passed through
(the node shares its GPUs)."""

Shape = tuple[int, str | None]
"""(GPUs requested, the pod's raw topology-policy annotation): what a cached answer depends on."""


class Answer(NamedTuple):
    """One node's answer for one request shape, with its JSON fragments (each "" where it does not apply, so
    a request's answer is `",".join(filter(None, ...))` of one field, without a Python loop)."""

    kind: int
    name: str
    passed: str
    """`"name"` when the node passes (`NodeNames`)."""
    failed: str
    """`"name":"reason"` when it failed (`FailedNodes`)."""
    unresolvable: str
    """`"name":"reason"` when it failed unresolvably (`FailedAndUnresolvableNodes`)."""
    score: str
    """`{"Host":"name","Score":n}`."""
    yields_below: float
    """A failed node's `NodeView.lowest_priority` (an incoming pod of higher priority may be preempting
    there, `ExtenderService.filter` then waits for the watch); +inf for every other node."""
    view: NodeView | None
    reason: str = ""


_INF = float("inf")
_KIND, _PASSED, _FAILED, _UNRESOLVABLE, _SCORE, _YIELDS = (
    itemgetter(0), itemgetter(2), itemgetter(3), itemgetter(4), itemgetter(5), itemgetter(6)
)  # fmt: skip


def answer(pod: PodInfo, name: str, view: NodeView | None, settings: Settings, now: float) -> Answer:
    """`name`'s answer for `pod`, as `filter_nodes` and `score_nodes` give it (pod.gpus > 0)."""
    quoted = encode_basestring(name)
    host = '{"Host":' + quoted + ',"Score":'
    if view is not None and view.passthrough:
        return Answer(DRA if view.dra_class else SHARED, name, quoted, "", "", host + "0}", _INF, view)
    verdict = assess(pod, view, settings, now, name)
    if isinstance(verdict, FitVerdict):
        entry = quoted + ":" + encode_basestring(verdict.reason)
        if verdict.resolvable:
            lowest = view.lowest_priority if view is not None else _INF
            return Answer(FAILED, name, "", entry, "", host + "0}", lowest, view, verdict.reason)
        kind = FRAGMENTED if verdict.fragmented else UNRESOLVABLE
        return Answer(kind, name, "", "", entry, host + "0}", _INF, view, verdict.reason)
    choice = choose_gpus(pod, view, settings, now, node=name).choice
    score = choice.score if choice is not None else 0
    return Answer(PASSED, name, quoted, "", "", host + f"{score}}}", _INF, view)


def pass_all(names: Iterable[str]) -> list[Answer]:
    """Every candidate passes with score 0: the answers for a pod that asks for no GPU."""
    out = []
    for name in names:
        quoted = encode_basestring(name)
        out.append(Answer(PASSED, name, quoted, "", "", '{"Host":' + quoted + ',"Score":0}', _INF, None))
    return out


def keepable(view: NodeView | None) -> bool:
    """Whether an answer derived from `view` depends on nothing but the view, the shape and the settings."""
    return view is not None and not (view.claims or view.nominated or view.preempting)


def may_be_settling(answers: Iterable[Answer], priority: int) -> bool:
    """Whether a failed node holds GPUs of a pod an incoming one of `priority` may just have preempted
    (terminating, or of lower priority): as `server._preemption_settling` asks it."""
    return min(map(_YIELDS, answers), default=_INF) < priority


class AnswerCache:
    """Per request shape, node name -> `Answer`, for the nodes whose answers may be kept (`keepable`)."""

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._by_shape: dict[Shape, dict[str, Answer]] = {}

    def __len__(self) -> int:
        return sum(len(answers) for answers in self._by_shape.values())

    def forget(self, names: Iterable[str]) -> None:
        """The nodes' views changed: their answers go."""
        for answers in self._by_shape.values():
            for name in names:
                answers.pop(name, None)

    def clear(self) -> None:
        self._by_shape.clear()

    def answers(
        self,
        pod: PodInfo,
        names: Sequence[str],
        view: Callable[[str], NodeView | None],
        settings: Settings,
        now: float,
        hot: Collection[str] = (),
    ) -> list[Answer]:
        """Each candidate's answer, in order: cached ones looked up, the others derived from `view(name)` (and
        kept when they may be). `hot` nodes are always derived (this replica's in-flight claims overlay
        their views) and never kept."""
        if settings is not self._settings:
            self._by_shape.clear()
            self._settings = settings
        cached = self._by_shape.setdefault((pod.gpus, pod.policy), {})
        get = cached.get
        found: list[Answer | None] = list(map(get, names))
        for name in hot:  # a few nodes; their places found in C, not by a Python pass over every name
            at = -1
            while True:
                try:
                    at = names.index(name, at + 1)
                except ValueError:
                    break
                found[at] = None
        if None in found:
            for i in compress(range(len(found)), map(not_, found)):  # the missing ones, found in C
                name = names[i]
                node = view(name)
                found[i] = hit = answer(pod, name, node, settings, now)
                if name not in hot and keepable(node):
                    cached[name] = hit
        return found  # type: ignore[return-value]


def warm(
    cache: AnswerCache, views: Iterable[NodeView], gpu_counts: Sequence[int], settings: Settings, now: float
) -> int:
    """Derive and keep each node's answers for pods of these sizes under the default policy, as the first
    request of each size would (and `fit.warm`'s memo with them); returns how many answers were derived.
    Done before the process freezes its long-lived objects out of GC scans, so these are frozen too."""
    views = list(views)
    names = [view.name for view in views]
    by_name = dict(zip(names, views, strict=True))
    for k in gpu_counts:
        cache.answers(PodInfo("", "", k), names, by_name.get, settings, now)
    return len(names) * len(gpu_counts)


def filter_body(
    pod: PodInfo, answers: Sequence[Answer], settings: Settings, now: float
) -> tuple[bytes, FilterCounts]:
    """The `ExtenderFilterResult` JSON (nodeCacheCapable) for these answers, byte for byte what the
    pydantic model gives for `filter_nodes` + `explain_room`; and how many nodes of each kind it holds."""
    passed = list(filter(None, map(_PASSED, answers)))
    failed = list(filter(None, map(_FAILED, answers)))
    unresolvable = list(filter(None, map(_UNRESOLVABLE, answers)))
    if unresolvable and countOf(map(_KIND, answers), FRAGMENTED):
        unresolvable = _explained(pod, answers, settings, now)
    dra = countOf(map(_KIND, answers), DRA) if passed else 0
    shared = countOf(map(_KIND, answers), SHARED) if passed else 0
    body = (
        '{"Nodes":null,"NodeNames":['
        + ",".join(passed)
        + '],"FailedNodes":{'
        + ",".join(failed)
        + '},"FailedAndUnresolvableNodes":{'
        + ",".join(unresolvable)
        + '},"Error":""}'
    )
    counts = FilterCounts(len(passed) - dra - shared, dra, len(failed), len(unresolvable), shared)
    return body.encode(), counts


class FilterCounts(NamedTuple):
    """How many candidates a filter answer passed, passed through (DRA; shared GPUs), failed and failed
    unresolvably."""

    passed: int
    dra: int
    failed: int
    unresolvable: int
    shared: int = 0


def _explained(pod: PodInfo, answers: Sequence[Answer], settings: Settings, now: float) -> list[str]:
    """The unresolvable entries, fragmented nodes' reasons completed by `explain_room` (per request: what
    preemption could do depends on the incoming pod's priority)."""
    fragmented = [a for a in answers if a.kind == FRAGMENTED]
    reasons = {a.name: a.reason for a in fragmented}
    explained = explain_room(
        pod,
        FilterResult((), {}, reasons, tuple(reasons)),
        {a.name: a.view for a in fragmented},
        settings,
        now,
    ).unresolvable
    return [
        a.unresolvable
        if a.kind != FRAGMENTED
        else encode_basestring(a.name) + ":" + encode_basestring(explained[a.name])
        for a in answers
        if a.unresolvable
    ]


def prioritize_body(answers: Iterable[Answer]) -> bytes:
    """The `HostPriorityList` JSON for these answers: `encode_host_priorities(score_nodes(...))`'s bytes."""
    return ("[" + ",".join(map(_SCORE, answers)) + "]").encode()


def job_answers(
    answers: Sequence[Answer], where: Callable[[str], tuple[str | None, str | None]], group: JobGroup
) -> list[Answer]:
    """The answers for a pod of the multi-pod job `group`: a member of a domain published degraded or failed
    (`where(name)`: the node's domain and published health) fails unresolvably with `domains.domain_refusal`'s
    reason, whatever its own answer was (preemption cannot make the domain healthy); every other node keeps
    its answer. Filter and prioritize both read these, so a refused node is neither passed nor scored."""
    out = list(answers)
    for i, a in enumerate(out):
        domain, health = where(a.name)
        reason = domain_refusal(domain, health, group)
        if reason is not None:
            quoted = encode_basestring(a.name)
            entry = quoted + ":" + encode_basestring(reason)
            out[i] = Answer(
                UNRESOLVABLE, a.name, "", "", entry, '{"Host":' + quoted + ',"Score":0}', _INF, a.view, reason
            )
    return out


def domain_prioritize_body(
    answers: Iterable[Answer],
    where: Callable[[str], tuple[str | None, str | None]],
    preferred: frozenset[str],
    weight: int,
) -> bytes:
    """`prioritize_body` for a pod of a multi-pod job: each node's score passed through the NVLink-domain
    placement rule (`domains.placement_score`; `where(name)`: the node's domain and published health,
    `preferred`: the domains its siblings already use). Nodes the rule leaves alone keep their fragment."""
    parts = []
    for a in answers:
        domain, health = where(a.name)
        if domain is None and health is None and not preferred:
            parts.append(a.score)
            continue
        cut = a.score.rindex(":") + 1
        score = int(a.score[cut:-1])
        new = placement_score(score, domain, health, preferred, weight)
        parts.append(a.score if new == score else f"{a.score[:cut]}{new}}}")
    return ("[" + ",".join(parts) + "]").encode()
