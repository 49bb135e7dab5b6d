"""The names of the config file's sections, in documentation order.

Why a module of its own: the environment-override parser and the node agent's lean loader need the names
without importing the pydantic models (`root.py` builds the `Config` model from them).
"""

SECTIONS = (
    "prometheus",
    "kubernetes",
    "adapter",
    "health",
    "drain",
    "nominations",
    "idle",
    "preemption",
    "extender",
    "domains",
    "node_agent",
    "logging",
)
