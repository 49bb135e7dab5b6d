"""The controller's GPU allocation model: one room below every capability that asks where GPUs are.

Which GPUs each node has and where they sit (`topology`), what a pod or node object says about GPUs
(`objects`: requests incl. restartable sidecars, the recorded `gpuwarden.io/gpu-ids`, the one quarantine
rule), the watch-backed model and its per-node views (`model`), GPU-set arithmetic (`placement`), whether
and where a pod fits (`fit`), the durable claim protocol (`claims`), which lower-priority pods to preempt to
free a set (`victims`), tenants and whom a preemption may take from another tenant (`tenants`), and the
room's only shell, the feed that keeps the model current (`feed`).

The extender serves this model; drain, make-room (GPU preemption), the preemption throttle and nomination
cleanup ask it. None of them restates a piece of it, and this package imports none of them (an
import-linter contract holds that). This init imports nothing, so the pure modules stay free of I/O.
"""
