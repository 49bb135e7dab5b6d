"""Stale nominatedNodeName cleanup: find pending pods whose nomination outlived its reason.

Pure core: `snapshot` (what is read from pods and nodes, our `gpuwarden.io/nomination` record), `plan`
(policy and plan types), `decide` (`plan_nominations`). Shell: `act` (pods/status patch, Eviction API,
Events), `loop` (`NominationLoop`, leader-gated), `metrics`. See docs/preemption.md.

This package init imports nothing, so `import controller.nominations.decide` stays free of I/O modules.
"""
