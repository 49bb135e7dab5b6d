"""gpuwarden: Prometheus-driven autoscaling metrics and GPU-health control for Kubernetes.

This package is the shared kernel: configuration models, the one Prometheus client, the one Kubernetes
access module, self-metrics, logging, the CLI and the fleet simulator. `adapter` and `controller` build on it.
"""

__version__ = "0.1.0"
