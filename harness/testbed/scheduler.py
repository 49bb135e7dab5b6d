"""KubeSchedulerConfiguration documents for the test bed's kube-scheduler.

gpuwarden ships a scheduler extender, so the e2e tier and the demo run the real kube-scheduler with an
``extenders`` list pointing at a process on this machine. These helpers build the v1 configuration (the only
version kwokctl accepts) with test-friendly defaults: no leader election (a restarted scheduler must not
wait for the old lease) and short pod back-off so retries after preemption or a late extender happen within
seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

API_VERSION = "kubescheduler.config.k8s.io/v1"
KIND = "KubeSchedulerConfiguration"


@dataclass(frozen=True)
class ExtenderSpec:
    """One entry of ``extenders`` (k8s.io/kube-scheduler/config/v1 ``Extender``)."""

    url_prefix: str
    filter_verb: str = "filter"
    prioritize_verb: str = ""
    preempt_verb: str = ""
    bind_verb: str = ""
    weight: int = 1
    node_cache_capable: bool = False
    ignorable: bool = False
    http_timeout: str = "5s"
    managed_resources: Sequence[str] = ()
    """Resources this extender is interested in; empty means every pod goes through it."""
    ignored_by_scheduler: bool = False
    """Whether the in-tree NodeResourcesFit plugin ignores ``managed_resources`` (extender-only resources)."""
    enable_https: bool = False
    tls_config: Mapping[str, Any] | None = None
    """``tlsConfig`` (``caFile``, ``certFile``, ``keyFile``, ...): the CA the scheduler trusts for the
    extender's serving certificate and the client certificate it presents."""

    def to_dict(self) -> dict[str, Any]:
        """The extender as it appears in the YAML document."""
        doc: dict[str, Any] = {
            "urlPrefix": self.url_prefix,
            "enableHTTPS": self.enable_https,
            "nodeCacheCapable": self.node_cache_capable,
            "ignorable": self.ignorable,
            "httpTimeout": self.http_timeout,
        }
        if self.tls_config is not None:
            doc["tlsConfig"] = dict(self.tls_config)
        for key, verb in (
            ("filterVerb", self.filter_verb),
            ("prioritizeVerb", self.prioritize_verb),
            ("preemptVerb", self.preempt_verb),
            ("bindVerb", self.bind_verb),
        ):
            if verb:
                doc[key] = verb
        if self.prioritize_verb:
            doc["weight"] = self.weight
        if self.managed_resources:
            doc["managedResources"] = [
                {"name": name, "ignoredByScheduler": self.ignored_by_scheduler}
                for name in self.managed_resources
            ]
        return doc


@dataclass(frozen=True)
class SchedulerSettings:
    """Top-level knobs of the generated configuration."""

    extenders: Sequence[ExtenderSpec] = ()
    pod_initial_backoff_seconds: int = 1
    pod_max_backoff_seconds: int = 2
    extra: dict[str, Any] = field(default_factory=dict)
    """Merged last into the document (e.g. ``{"profiles": [...]}``)."""


def scheduler_configuration(settings: SchedulerSettings | None = None) -> dict[str, Any]:
    """A KubeSchedulerConfiguration dict; kwokctl fills in ``clientConnection.kubeconfig``."""
    settings = settings or SchedulerSettings()
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "leaderElection": {"leaderElect": False},
        "podInitialBackoffSeconds": settings.pod_initial_backoff_seconds,
        "podMaxBackoffSeconds": settings.pod_max_backoff_seconds,
    }
    if settings.extenders:
        doc["extenders"] = [e.to_dict() for e in settings.extenders]
    doc.update(settings.extra)
    return doc
