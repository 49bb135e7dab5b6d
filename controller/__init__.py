"""The controller process: health quarantine, drain, nominations, make-room, idle GPUs, preemption throttle,
extender (the rooms and floors: docs/architecture.md).

Never imports `adapter`.
"""
