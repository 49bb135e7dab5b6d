"""Make-room: GPU preemption on fragmented nodes, where kube-scheduler's count-based preemption cannot help.

Pure core: `plan` (which pending pod, which node, which victims, from the GPU model's victim choice).
Shell: `loop` (observe the pending pods the extender rejected as fragmented, decide through the preemption
throttle's budgets, reserve the freed GPUs, evict through the Eviction API). See docs/preemption.md.

This package init imports nothing, so `import controller.makeroom.plan` stays free of I/O modules.
"""
