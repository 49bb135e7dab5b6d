"""The root `Config` model: one YAML file, one key per section, every section optional.

Why a root model of its own: it is the single contract between the config file and the code. Each
deployable reads only its sections (the adapter: prometheus, kubernetes, adapter, logging; the controller:
the rest), but the whole file is validated at once so `gpuwarden check-config` reports every problem in one
pass and a typo in a section one process ignores still fails loudly.
"""

from __future__ import annotations

from pydantic import Field

from gpuwarden.config.adapter import AdapterConfig
from gpuwarden.config.base import Section
from gpuwarden.config.domains import DomainsConfig
from gpuwarden.config.drain import DrainConfig
from gpuwarden.config.extender import ExtenderConfig
from gpuwarden.config.health import HealthConfig
from gpuwarden.config.idle import IdleConfig
from gpuwarden.config.kubernetes import KubernetesConfig
from gpuwarden.config.logging import LoggingConfig
from gpuwarden.config.node_agent import NodeAgentConfig
from gpuwarden.config.nominations import NominationsConfig
from gpuwarden.config.preemption import PreemptionConfig
from gpuwarden.config.prometheus import PrometheusConfig
from gpuwarden.config.sections import SECTIONS

__all__ = ["SECTIONS", "Config"]


class Config(Section):
    """The whole gpuwarden configuration. Every section has working defaults; an empty file is valid."""

    prometheus: PrometheusConfig = Field(
        default_factory=PrometheusConfig, description="How to reach Prometheus (or a compatible server)."
    )
    kubernetes: KubernetesConfig = Field(
        default_factory=KubernetesConfig, description="API-server access and leader election."
    )
    adapter: AdapterConfig = Field(default_factory=AdapterConfig, description="The metrics API server.")
    health: HealthConfig = Field(default_factory=HealthConfig, description="GPU-health quarantine.")
    drain: DrainConfig = Field(
        default_factory=DrainConfig, description="Moving work off quarantined GPUs (opt-in)."
    )
    nominations: NominationsConfig = Field(
        default_factory=NominationsConfig, description="Stale nominatedNodeName cleanup."
    )
    idle: IdleConfig = Field(default_factory=IdleConfig, description="Idle-GPU detection (opt-in).")
    preemption: PreemptionConfig = Field(
        default_factory=PreemptionConfig, description="Cascading-preemption throttle."
    )
    extender: ExtenderConfig = Field(default_factory=ExtenderConfig, description="Scheduler extender.")
    domains: DomainsConfig = Field(
        default_factory=DomainsConfig,
        description="NVLink domains (GB200/GB300 NVL72): domain health and placement inside one.",
    )
    node_agent: NodeAgentConfig = Field(
        default_factory=NodeAgentConfig, description="The per-node agent (`gpuwarden node-agent`)."
    )
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Log level and format.")
