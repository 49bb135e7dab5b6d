"""Topology-aware kube-scheduler extender: filter / prioritize / preempt / bind over HTTP.

It serves the GPU model of `controller.gpus` (topology, model, fit, claims, victims, feed) and owns only the
protocol: `wire` (extender/v1 JSON), `events` (bind Events), `metrics`; shell: `bind` (claim-verify-bind
against the API), `server` (aiohttp routes), `runtime` (wiring from config). The controller mounts it with::

    from controller.extender.runtime import build_extender

    extender = build_extender(config, kube, prometheus=prom, registry=registry)
    extender.mount(app)          # POST <extender.path_prefix>/{filter,prioritize,preempt,bind}
    await extender.run()         # keeps the model current; extender.ready() for the readiness probe

This package init imports nothing, so `import controller.extenderv1` stays free of I/O modules.
See docs/extender.md.
"""
