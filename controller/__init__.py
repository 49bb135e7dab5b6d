"""The controller process: health quarantine, nominations, preemption throttle, extender (issues 5-7).

Never imports `adapter`.
"""
