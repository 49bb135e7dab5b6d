"""The test and demo harness that sits beside gpuwarden: never imported by the product, never shipped.

- ``harness.testbed``: the local control plane (upstream kube-apiserver, etcd, controller-manager, scheduler,
  kwok nodes, one real kubelet node) built from the Go wrapper modules in ``tests/testbed``;
- ``harness.simulator``: a dcgm-exporter look-alike for a simulated GPU fleet (``gpuwarden simulate``);
- ``harness.demo``: the scripted end-to-end demo with its HTML report (``gpuwarden demo``);
- ``harness.localprom``: a real Prometheus server started for tests and the demo.

The product packages (``gpuwarden``, ``adapter``, ``controller``, ``nodeagent``) must not import this package
(an import-linter contract holds that); only the CLI's ``demo`` and ``simulate`` commands import it
lazily, and say so clearly where it is not installed. The wheel and the image leave it out; ``make deps``
puts a checkout's copy on the virtualenv's path.
"""
