"""Cascading-preemption throttle: observe preemptions, bound them in the extender's preempt verb.

Pure core: `signals` (workloads, DisruptionTarget, `Preempted` Events), `graph` (the sliding-window
preemption graph), `throttle` (`decide_preemption`). Shell: `observer` (watches), `tenancy` (Namespaces
and ResourceQuotas for the cross-tenant rule), `hook` (`PreemptionThrottle`, the extender's
`PreemptHook`), `metrics`. See docs/preemption.md.

This package init imports nothing, so `import controller.preemption.throttle` stays free of I/O modules.
"""
