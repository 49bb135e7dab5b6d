"""Idle GPUs: pods that hold GPUs they do not use — detected from DCGM utilization and reported.

`query` builds the one grouped PromQL query of a pass and reads its answer; `snapshot` reads pods from the
shared informer and joins them to their GPUs' usage; `decide` is the pure verdict and plan; `observe`,
`act` and `loop` are the shell (Prometheus in, annotations and Events out).
"""
