"""The custom.metrics.k8s.io / external.metrics.k8s.io API server. Never imports `controller`."""
