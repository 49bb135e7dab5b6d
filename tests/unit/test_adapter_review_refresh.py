"""Refresh-ahead of allowed SubjectAccessReview answers: `review_due` (table) and `KubeReviews` on a clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from adapter import auth

TTL, STALE = 10.0, 10.0


@pytest.mark.parametrize(
    ("age", "value", "stale", "expected"),
    [
        (None, None, STALE, "ask"),  # nothing cached
        (0.0, True, STALE, "use"),
        (10.0, True, STALE, "use"),  # the TTL's last moment
        (10.0, False, STALE, "use"),  # a deny within its TTL
        (10.1, True, STALE, "use-and-refresh"),
        (20.0, True, STALE, "use-and-refresh"),
        (20.1, True, STALE, "ask"),  # too old even for refresh-ahead
        (10.1, False, STALE, "ask"),  # a deny is never used stale
        (10.1, True, 0.0, "ask"),  # refresh-ahead off
    ],
)
def test_review_due(age: float | None, value: Any, stale: float, expected: str) -> None:
    assert auth.review_due(age, value, TTL, stale) == expected


class Kube:
    """Answers SubjectAccessReviews with `allow` once `release` is set; counts them."""

    def __init__(self) -> None:
        self.allow, self.posts, self.fail = True, 0, False
        self.release = asyncio.Event()
        self.release.set()

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        await self.release.wait()
        self.posts += 1
        if self.fail:
            raise RuntimeError("API server unreachable")
        return {"status": {"allowed": self.allow}}


USER = auth.UserInfo("system:serviceaccount:kube-system:horizontal-pod-autoscaler")
ASK = {"resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "ml"}}


def reviews(kube: Kube, now: list[float], stale: float = STALE) -> auth.KubeReviews:
    return auth.KubeReviews(kube, TTL, stale, clock=lambda: now[0])  # type: ignore[arg-type]


async def test_an_expired_allow_is_used_while_it_is_rechecked_and_the_recheck_replaces_it() -> None:
    kube, now = Kube(), [0.0]
    r = reviews(kube, now)
    assert await r.allowed(USER, ASK) is True and kube.posts == 1
    now[0] = 15.0  # the next HPA sync: past the TTL
    kube.allow = False  # the grant was revoked meanwhile
    kube.release.clear()
    # answered at once from the expired allow (the review is held back: waiting for it would time out)
    assert await asyncio.wait_for(r.allowed(USER, ASK), 5) is True
    assert await asyncio.wait_for(r.allowed(USER, ASK), 5) is True  # still in flight: one re-check
    kube.release.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert kube.posts == 2
    assert await r.allowed(USER, ASK) is False  # the re-check's deny replaced it


async def test_without_refresh_ahead_an_expired_allow_waits_for_its_review() -> None:
    kube, now = Kube(), [0.0]
    r = reviews(kube, now, stale=0.0)
    assert await r.allowed(USER, ASK) is True
    now[0] = 15.0
    kube.allow = False
    assert await r.allowed(USER, ASK) is False and kube.posts == 2


async def test_a_deny_is_never_used_stale() -> None:
    kube, now = Kube(), [0.0]
    kube.allow = False
    r = reviews(kube, now)
    assert await r.allowed(USER, ASK) is False
    now[0] = 15.0
    kube.allow = True
    assert await r.allowed(USER, ASK) is True and kube.posts == 2  # asked in the request


async def test_a_failed_recheck_is_not_raised_and_the_next_caller_past_the_window_asks() -> None:
    kube, now = Kube(), [0.0]
    r = reviews(kube, now)
    assert await r.allowed(USER, ASK) is True
    now[0] = 15.0
    kube.fail = True
    assert await r.allowed(USER, ASK) is True  # the background re-check fails: logged, not raised
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    now[0] = 25.0  # past TTL + refresh-ahead: the failure reaches the caller as before
    with pytest.raises(RuntimeError):
        await r.allowed(USER, ASK)


@pytest.mark.parametrize(
    ("age", "value", "idle", "stale", "expected"),
    [
        (None, None, 0.0, STALE, False),  # nothing cached: the request asks
        (7.9, True, 0.0, STALE, False),  # not yet in the last RECHECK_LEAD seconds of the TTL
        (8.0, True, 0.0, STALE, True),
        (12.0, True, 5.0, STALE, True),  # past the TTL and still in use
        (8.0, False, 0.0, STALE, False),  # a deny is asked in the request, never ahead
        (8.0, True, 20.0, STALE, True),  # asked for within TTL + refresh-ahead
        (8.0, True, 20.1, STALE, False),  # no longer asked for: left to expire
        (8.0, True, 0.0, 0.0, False),  # refresh-ahead off
    ],
)
def test_recheck_due(age: float | None, value: Any, idle: float, stale: float, expected: bool) -> None:
    assert auth.recheck_due(age, value, idle, TTL, stale) is expected


def test_recheck_lead_is_at_most_half_a_short_ttl() -> None:
    assert auth.recheck_due(0.9, True, 0.0, 2.0, STALE) is False
    assert auth.recheck_due(1.0, True, 0.0, 2.0, STALE) is True


async def test_an_allow_in_use_is_rechecked_before_it_expires_and_replaced_by_the_answer() -> None:
    kube, now = Kube(), [0.0]
    r = reviews(kube, now)
    assert await r.allowed(USER, ASK) is True and kube.posts == 1
    now[0] = 7.0
    assert await r.recheck() == 0  # fresh enough
    now[0] = 8.5
    kube.allow = False  # revoked: the re-check finds out before any request needs the answer
    assert await r.recheck() == 1 and kube.posts == 2
    assert await r.recheck() == 0  # a deny is not re-checked ahead
    assert await r.allowed(USER, ASK) is False and kube.posts == 2  # the re-check's answer, no new review


async def test_a_failed_recheck_is_not_raised() -> None:
    kube, now = Kube(), [0.0]
    r = reviews(kube, now)
    assert await r.allowed(USER, ASK) is True
    now[0], kube.fail = 8.5, True
    assert await r.recheck() == 1 and kube.posts == 2
    assert await r.allowed(USER, ASK) is True  # the answer it had, within its TTL


async def test_rechecks_are_paced() -> None:
    class Counting(Kube):
        def __init__(self) -> None:
            super().__init__()
            self.inflight = self.most = 0

        async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
            self.inflight += 1
            self.most = max(self.most, self.inflight)
            await asyncio.sleep(0)
            self.inflight -= 1
            return await super().request(method, path, **kwargs)

    kube, now = Counting(), [0.0]
    r = reviews(kube, now)
    for ns in range(20):
        assert await r.allowed(USER, {"resourceAttributes": {"verb": "get", "namespace": f"ns-{ns}"}})
    kube.most = 0
    now[0] = 9.0
    assert await r.recheck() == 20 and kube.posts == 40
    assert kube.most == auth.RECHECK_CONCURRENCY


async def test_an_allow_nobody_asks_for_any_more_is_not_rechecked() -> None:
    kube, now = Kube(), [0.0]
    r = reviews(kube, now)
    assert await r.allowed(USER, ASK) is True
    now[0] = 20.1  # last asked for at 0: past TTL + refresh-ahead
    assert await r.recheck() == 0 and kube.posts == 1
    now[0] = 20.0
    assert await r.recheck() == 0  # forgotten for good, even were the clock to say otherwise


async def test_without_refresh_ahead_nothing_is_rechecked() -> None:
    kube, now = Kube(), [0.0]
    r = reviews(kube, now, stale=0.0)
    assert await r.allowed(USER, ASK) is True
    now[0] = 9.0
    assert await r.recheck() == 0 and kube.posts == 1
    await asyncio.wait_for(r.run_rechecks(), 5)  # returns at once
