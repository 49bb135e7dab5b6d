"""Topology-aware kube-scheduler extender: filter / prioritize / preempt / bind over HTTP (issue 6).

Pure core: `wire` (extender/v1 JSON), `topology`, `model`, `placement`, `decide`, `claims`.
Shell: `bind` (claim-verify-bind against the API), `server` (aiohttp routes), `feed` (watches, error trends),
`runtime` (wiring from config). The controller mounts it with::

    from controller.extender.runtime import build_extender

    extender = build_extender(config, kube, prometheus=prom, registry=registry)
    extender.mount(app)          # POST <extender.path_prefix>/{filter,prioritize,preempt,bind}
    await extender.run()         # keeps the model current; extender.ready() for the readiness probe

This package init imports nothing, so `import controller.extender.decide` stays free of I/O modules.
See docs/extender.md.
"""
