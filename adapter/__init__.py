"""The custom.metrics.k8s.io / external.metrics.k8s.io API server (issue 4). Never imports `controller`."""
