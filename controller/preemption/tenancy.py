"""`TenantFeed`: the Namespaces and ResourceQuotas the cross-tenant rule reads, kept by list+watch.

Why it exists: the preempt verb must not call the API on its path, yet it needs every namespace's tenant
label and every quota's GPU limit (controller.gpus.tenants). Both kinds are small and change rarely, so one
informer each keeps them; the GPUs each tenant holds come from the GPU model the extender already keeps.
With the rule `any` (the default) nothing is watched and no RBAC beyond today's is needed.

What it must not do: decide. `tenancy()` only assembles the snapshot `tenancy_from` turns into a `Tenancy`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from controller.gpus.model import ClusterModel
from controller.gpus.tenants import Rule, Tenancy, TenantPolicy, policy_from_config, tenancy_from
from gpuwarden.config.root import Config
from gpuwarden.kube import NAMESPACES, RESOURCE_QUOTAS, Informer, KubeClient


def tenancy_from_lists(
    config: Config,
    namespaces: list[dict[str, Any]],
    quotas: list[dict[str, Any]],
    model: ClusterModel | None,
) -> Tenancy | None:
    """The snapshot from listed Namespaces and ResourceQuotas (`gpuwarden plan`); None with the rule `any`."""
    policy = policy_from_config(config.preemption.tenants)
    if policy.rule is Rule.ANY:
        return None
    held = model.held_by_namespace() if model is not None else []
    resource = model.resource if model is not None else "nvidia.com/gpu"
    return tenancy_from(namespaces, quotas, held, policy, resource)


MAX_AGE_SECONDS = 1.0
"""How long one tenancy snapshot answers (building it reads every GPU pod: ~6 ms for 20,000 of them)."""


class TenantFeed:
    """`await feed.run()` keeps the caches; `feed.tenancy(model, now)` is the snapshot (None: rule `any`),
    rebuilt at most every `MAX_AGE_SECONDS`."""

    def __init__(self, config: Config, kube: KubeClient | None) -> None:
        self._last: tuple[float, Tenancy] | None = None
        self.max_age = MAX_AGE_SECONDS
        self.policy: TenantPolicy = policy_from_config(config.preemption.tenants)
        self.active = self.policy.rule is not Rule.ANY
        self.namespaces: Informer | None = None
        self.quotas: Informer | None = None
        if self.active and kube is not None:
            k = config.kubernetes
            page, timeout = k.list_page_size, int(k.watch_timeout_seconds)
            self.namespaces = Informer(kube, NAMESPACES, page_size=page, watch_timeout=timeout)
            self.quotas = Informer(kube, RESOURCE_QUOTAS, page_size=page, watch_timeout=timeout)

    @property
    def synced(self) -> bool:
        """Both caches listed once (always true with the rule `any`)."""
        if not self.active:
            return True
        if self.namespaces is None or self.quotas is None:
            return False
        return self.namespaces.synced.is_set() and self.quotas.synced.is_set()

    def tenancy(self, model: ClusterModel | None, now: float | None = None) -> Tenancy | None:
        """Tenants, shares and holdings now; None when the rule is `any` (nothing to check). Without a GPU
        model no tenant holds anything, so `over-share` refuses every other tenant's pod. With `now`, a
        snapshot younger than `max_age` (`MAX_AGE_SECONDS`) is reused."""
        if not self.active:
            return None
        if now is not None and self._last is not None and 0 <= now - self._last[0] < self.max_age:
            return self._last[1]
        built = self._build(model)
        if now is not None:
            self._last = (now, built)
        return built

    def _build(self, model: ClusterModel | None) -> Tenancy:
        namespaces = self.namespaces.objects() if self.namespaces is not None else []
        quotas = self.quotas.objects() if self.quotas is not None else []
        held = model.held_by_namespace() if model is not None else []
        resource = model.resource if model is not None else "nvidia.com/gpu"
        return tenancy_from(namespaces, quotas, held, self.policy, resource)

    async def wait_synced(self) -> None:
        if self.namespaces is not None and self.quotas is not None:
            await self.namespaces.synced.wait()
            await self.quotas.synced.wait()

    async def run(self) -> None:
        """Run both informers until cancelled (returns at once with the rule `any`)."""
        if self.namespaces is None or self.quotas is None:
            return
        await asyncio.gather(self.namespaces.run(), self.quotas.run())
