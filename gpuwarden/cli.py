"""The `gpuwarden` command line: one entry point, one sub-command per deployable or tool.

Kept thin on purpose: each sub-command parses flags, loads config, sets up logging and hands over to the
module that does the work. Heavy imports happen inside the sub-command so `gpuwarden --help` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuwarden import __version__

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

DESCRIPTION = """\
gpuwarden keeps GPU fleets on Kubernetes right-sized and healthy, driven by Prometheus.

  adapter       serve custom.metrics.k8s.io and external.metrics.k8s.io from Prometheus (for HPAs), and
                KEDA's external scaler (gRPC) from the same cache (--keda)
  controller    GPU-health quarantine, nomination cleanup, preemption throttle, scheduler extender
  node-agent    per GPU node: publish GPU topology, record the GPUs containers actually got (kubelet
                PodResources), optionally serve the device-plugin API so the recorded GPUs are handed out
  plan          one-shot: print what the controller would do now (JSON or table), change nothing
  preflight     what the cluster already runs, what an install would collide with, each with the value to set
  uninstall     lift what gpuwarden wrote (taints, conditions, annotations, DeviceTaintRules, Lease)
  check-config  validate a config file and report every error at once, each naming its field
  simulate      fleet simulator: a dcgm-exporter-compatible exporter for N nodes x M GPUs
  demo          the main job on a local kwok GPU fleet, end to end, with an HTML report
  keda convert  rewrite ScaledObjects' prometheus triggers as gpuwarden external triggers (where equal)
  dra claim-template
                a ResourceClaimTemplate asking DRA-backed nodes for NUMA- or PCIe-aligned GPUs

Config: one YAML file (--config); env overrides GPUWARDEN_<SECTION>__<KEY>; flags override both.
"""

Handler = Callable[[argparse.Namespace], int]


def _add_common(p: argparse.ArgumentParser, *, config_required: bool = False) -> None:
    p.add_argument(
        "--config",
        type=Path,
        required=config_required,
        help="YAML config file (see docs/configuration.md). Unknown keys are errors.",
    )
    p.add_argument("--kubeconfig", type=Path, help="overrides kubernetes.kubeconfig (default: in-cluster)")
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="overrides logging.level"
    )
    p.add_argument(
        "--log-format",
        choices=["json", "text", "auto"],
        help="overrides logging.format (auto: text on a TTY)",
    )


def _cmd_check_config(args: argparse.Namespace) -> int:
    from adapter.app import validate_config
    from gpuwarden.config.loader import check_config

    # the adapter's own template engine judges metricsQuery / resources.template, as it will at start
    code, text = check_config(args.file, os.environ, checks=[validate_config])
    stream = sys.stdout if code == EXIT_OK else sys.stderr
    print(text, file=stream, end="" if text.endswith("\n") else "\n")
    return code


def _with_common(args: argparse.Namespace, overrides: dict[str, object]) -> dict[str, object]:
    return {
        **overrides,
        "kubernetes.kubeconfig": str(args.kubeconfig) if args.kubeconfig else None,
        "logging.level": args.log_level,
        "logging.format": args.log_format,
    }


def _load(args: argparse.Namespace, overrides: dict[str, object]) -> Any:
    """Load config (file < env < flags) and set up logging; on error print every problem and return None."""
    from gpuwarden import logs
    from gpuwarden.config import load_config
    from gpuwarden.config.report import format_problems
    from gpuwarden.errors import ConfigError

    overrides = _with_common(args, overrides)
    try:
        config = load_config(args.config, os.environ, overrides)
    except ConfigError as exc:
        print(format_problems(exc.problems, str(args.config or "(defaults)")), file=sys.stderr, end="")
        return None
    logs.setup(config.logging.level, config.logging.format)
    return config


ADAPTER_SECTIONS = ("prometheus", "kubernetes", "adapter", "logging")
"""The sections the adapter reads (the whole file is still validated)."""


def _load_in_child(args: argparse.Namespace, overrides: dict[str, object], sections: Sequence[str]) -> Any:
    """`_load`, with the validation in a child process: this process never imports pydantic and the
    config models (~11 MiB of RSS for a server that reads its config once). The sections come back as
    plain records with the models' field names (gpuwarden/config/view.py); problems are printed the same."""
    from gpuwarden import logs
    from gpuwarden.config.view import ExportFailed, load_in_child

    try:
        config = load_in_child(args.config, _with_common(args, overrides), sections)
    except ExportFailed as exc:
        print(exc.text, file=sys.stderr, end="")
        return None
    logs.setup(config.logging.level, config.logging.format)
    return config


def _run_until_signal(coro_factory: Callable[[], Any]) -> int:
    """Run a server coroutine until SIGINT/SIGTERM, then cancel it so it cleans up."""
    import signal

    async def runner() -> None:
        task = asyncio.ensure_future(coro_factory())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(runner())
    return EXIT_OK


def _cmd_adapter(args: argparse.Namespace) -> int:
    overrides: dict[str, object] = {
        "prometheus.url": args.prometheus_url,
        "adapter.secure_port": args.secure_port,
        "adapter.keda.enabled": True if args.keda else None,
        "adapter.keda.port": args.keda_port,
    }
    config = _load_in_child(args, overrides, ADAPTER_SECTIONS)
    if config is None:
        return EXIT_FAILED
    from gpuwarden import aiohttplib

    aiohttplib.import_without_ca_bundle()  # before anything imports aiohttp (~1.9 MiB: aiohttplib.py)
    from adapter.app import run_adapter

    return _run_until_signal(lambda: run_adapter(config))


def _cmd_controller(args: argparse.Namespace) -> int:
    overrides: dict[str, object] = {"prometheus.url": args.prometheus_url}
    if args.dry_run:
        overrides.update(
            {
                "health.dry_run": True,
                "nominations.dry_run": True,
                "preemption.dry_run": True,
                "drain.dry_run": True,
            }
        )
    config = _load(args, overrides)
    if config is None:
        return EXIT_FAILED
    from controller.app import run_controller
    from gpuwarden.config.report import format_problems
    from gpuwarden.errors import ConfigError

    try:
        return _run_until_signal(lambda: run_controller(config, dry_run=True if args.dry_run else None))
    except ConfigError as exc:  # a file the config names, found unusable at start (extender.tls)
        print(format_problems(exc.problems, str(args.config or "(defaults)")), file=sys.stderr, end="")
        return EXIT_FAILED


def _cmd_node_agent(args: argparse.Namespace) -> int:
    overrides: dict[str, object] = {
        "node_agent.node_name": args.node_name,
        "node_agent.topology_file": str(args.topology_file) if args.topology_file else None,
        "node_agent.topology_source": "file" if args.topology_file else None,
        "node_agent.listen": args.listen,
    }
    if args.dry_run:
        overrides["node_agent.dry_run"] = True
    if args.device_plugin:
        overrides["node_agent.device_plugin.enabled"] = True
    from gpuwarden import logs
    from gpuwarden.config.lean import load_lean

    # A plainly valid node-agent file is read without pydantic (gpuwarden/config/lean.py says why);
    # anything else, errors included, is judged by the full loader.
    config: Any = load_lean(args.config, os.environ, _with_common(args, overrides))
    if config is not None:
        logs.setup(config.logging.level, config.logging.format)
    else:
        config = _load(args, overrides)
    if config is None:
        return EXIT_FAILED
    from nodeagent.app import node_name_from, run_node_agent

    try:
        node_name_from(config)
    except ValueError as exc:
        print(f"gpuwarden node-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _run_until_signal(lambda: run_node_agent(config))


def _cmd_plan(args: argparse.Namespace) -> int:
    config = _load(args, {"prometheus.url": args.prometheus_url})
    if config is None:
        return EXIT_FAILED
    import json

    from controller.app import plan_once
    from controller.modes import capability_modes
    from gpuwarden.errors import GpuwardenError

    try:
        plan = asyncio.run(plan_once(config))
    except GpuwardenError as exc:
        print(f"gpuwarden plan: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    # observe: the capability plans (below) and writes nothing; act: the controller applies its plan
    modes = capability_modes(config, dry_run=None)
    if args.output == "json":
        print(json.dumps({**plan.to_dict(), "modes": modes}, indent=2, sort_keys=True))
    else:
        print("MODES  " + "  ".join(f"{name}={mode}" for name, mode in modes.items()))
        print(plan.render_table())
    return EXIT_OK


def _cmd_preflight(args: argparse.Namespace) -> int:
    config = _load(args, {"prometheus.url": args.prometheus_url})
    if config is None:
        return EXIT_FAILED
    from gpuwarden.kube import KubeClient
    from gpuwarden.preflight import APIS, Intent, decide, observe, render
    from gpuwarden.promclient import PrometheusClient

    k = config.kubernetes

    async def run() -> Any:
        kube = KubeClient.from_config(kubeconfig=args.kubeconfig or k.kubeconfig, context=k.context,
                                      request_timeout=k.request_timeout_seconds)  # fmt: skip
        async with kube, PrometheusClient(config.prometheus) as prom:
            return await observe(kube, prom, str(config.prometheus.url))

    facts = asyncio.run(run())
    claims = None if args.claims is None else frozenset(c for c in args.claims.split(",") if c)
    unknown = sorted((claims or frozenset()) - set(APIS))
    if unknown:
        print(
            f"--claims: unknown APIService {', '.join(unknown)} (known: {', '.join(APIS)})", file=sys.stderr
        )
        return EXIT_FAILED
    findings = decide(facts, Intent(claims, args.take_over))
    print(render(facts, findings), end="")
    return EXIT_FAILED if any(f.status == "conflict" for f in findings) and args.strict else EXIT_OK


def _cmd_uninstall(args: argparse.Namespace) -> int:
    config = _load(args, {})
    if config is None:
        return EXIT_FAILED
    from controller.app import kube_client
    from controller.health.loop import controller_namespace
    from controller.uninstall import run_uninstall

    namespace = args.namespace or controller_namespace(config)
    lease = config.kubernetes.leader_election.lease_name

    async def run() -> tuple[Any, list[str]]:
        async with kube_client(config, args.kubeconfig, None) as kube:
            return await run_uninstall(
                kube,
                namespace=namespace,
                node_agent_namespace=args.node_agent_namespace,
                lease=lease,
                stop=not args.keep_running,
                dry_run=args.dry_run,
            )

    plan, failures = asyncio.run(run())
    verb = "would lift" if args.dry_run else "lifted"
    lines = plan.lines()
    print(f"gpuwarden uninstall: {verb} {len(lines)} item(s)" + (" (dry-run)" if args.dry_run else ""))
    for line in lines:
        print(f"  {line}")
    for failure in failures:
        print(f"failed: {failure}", file=sys.stderr)
    return EXIT_FAILED if failures else EXIT_OK


_NO_HARNESS = (
    "gpuwarden {command}: the test and demo harness is not installed here. It lives beside the product in a "
    "checkout of the gpuwarden repository (harness/) and is never shipped in the wheel or the image: run "
    "`make deps` in a checkout, then `.venv/bin/gpuwarden {command}` (or `make demo`)."
)


def _harness_missing(command: str, exc: ModuleNotFoundError) -> bool:
    """True (and a clear message printed) when the import failed because the harness is absent."""
    if exc.name is None or not (exc.name == "harness" or exc.name.startswith("harness.")):
        return False
    print(_NO_HARNESS.format(command=command), file=sys.stderr)
    return True


def _cmd_keda_convert(args: argparse.Namespace) -> int:
    import yaml

    from adapter.kedaconvert import Options, convert_documents
    from gpuwarden.config import load_config
    from gpuwarden.config.report import format_problems
    from gpuwarden.errors import ConfigError

    try:
        config = load_config(args.config, os.environ)
    except ConfigError as exc:
        print(format_problems(exc.problems, str(args.config or "(defaults)")), file=sys.stderr, end="")
        return EXIT_FAILED
    try:
        text = sys.stdin.read() if str(args.file) == "-" else args.file.read_text()
        documents = list(yaml.safe_load_all(text))
    except (OSError, yaml.YAMLError) as exc:
        print(f"gpuwarden keda convert: cannot read {args.file}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    options = Options(
        scaler_address=args.scaler_address,
        auth_ref=args.auth_ref,
        push=args.push,
        transport=args.transport,
    )
    converted, reports = convert_documents(documents, config.adapter.presets, options)
    sys.stdout.write(yaml.safe_dump_all(converted, sort_keys=False, width=10_000))
    for report in reports:
        print(report.line(), file=sys.stderr)
    if not reports:
        print("gpuwarden keda convert: no prometheus trigger found", file=sys.stderr)
    kept = sum(not r.converted for r in reports)
    return EXIT_FAILED if args.strict and kept else EXIT_OK


def _cmd_dra_claim_template(args: argparse.Namespace) -> int:
    import yaml

    from controller.gpus.claimtemplate import TemplateError, claim_template, pod_usage

    try:
        template = claim_template(
            gpus=args.gpus,
            policy=args.policy,
            device_class=args.device_class,
            namespace=args.namespace,
            name=args.name or "",
        )
    except TemplateError as exc:
        print(f"gpuwarden dra claim-template: {exc}", file=sys.stderr)
        return EXIT_FAILED
    usage = yaml.safe_dump(pod_usage(template["metadata"]["name"]), sort_keys=False)
    print("# Use it from a pod (instead of an nvidia.com/gpu limit):")
    print("\n".join(f"#   {line}" for line in usage.rstrip().splitlines()))
    sys.stdout.write(yaml.safe_dump(template, sort_keys=False))
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    try:
        from harness.demo import run_demo
    except ModuleNotFoundError as exc:
        if _harness_missing("demo", exc):
            return EXIT_FAILED
        raise

    return run_demo(args.scenario, args.out, args.keep)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from gpuwarden import logs
    from gpuwarden.errors import ConfigError

    try:
        from harness.simulator import load_scenario, serve
    except ModuleNotFoundError as exc:
        if _harness_missing("simulate", exc):
            return EXIT_FAILED
        raise

    logs.setup(args.log_level or "info", args.log_format or "auto")
    try:
        scenario = load_scenario(args.scenario)
    except ConfigError as exc:
        for field, msg in exc.problems:
            print(f"{args.scenario}: {field}: {msg}", file=sys.stderr)
        return EXIT_FAILED
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        print(f"--listen: expected HOST:PORT, got {args.listen!r}", file=sys.stderr)
        return EXIT_USAGE
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(scenario, host.strip("[]"), int(port)))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuwarden", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"gpuwarden {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("adapter", help="serve the custom and external metrics APIs from Prometheus")
    _add_common(p)
    p.add_argument("--prometheus-url", help="overrides prometheus.url")
    p.add_argument("--secure-port", type=int, help="overrides adapter.secure_port")
    p.add_argument(
        "--keda",
        action="store_true",
        help="serve KEDA's external scaler (gRPC) too; overrides adapter.keda.enabled (docs/keda.md)",
    )
    p.add_argument("--keda-port", type=int, help="overrides adapter.keda.port (gRPC, default 6000)")
    p.set_defaults(func=_cmd_adapter)

    p = sub.add_parser("controller", help="GPU-health quarantine, nominations, preemption, extender")
    _add_common(p)
    p.add_argument("--prometheus-url", help="overrides prometheus.url")
    p.add_argument("--dry-run", action="store_true", help="compute and log/event plans; patch nothing")
    p.set_defaults(func=_cmd_controller)

    p = sub.add_parser(
        "node-agent",
        help="per GPU node: topology, actual GPU allocations reconciled, optional device plugin",
        description="One per GPU node (a DaemonSet). Publishes the gpuwarden.io/gpu-topology annotation "
        "on its Node from NVML, sysfs or --topology-file; reads the kubelet PodResources API and writes the "
        "GPUs each container actually holds on its pod (gpuwarden.io/gpu-ids), counting and eventing "
        "overrides; with --device-plugin it is the node's device plugin for nvidia.com/gpu and hands out "
        "the recorded GPUs. Touches only its own Node and the pods bound to it.",
    )
    _add_common(p)
    p.add_argument("--node-name", help="overrides node_agent.node_name (default: $NODE_NAME)")
    p.add_argument(
        "--device-plugin", action="store_true", help="serve the kubelet device-plugin API (enforce mode)"
    )
    p.add_argument("--topology-file", type=Path, help="read the topology from this file (simulated nodes)")
    p.add_argument("--listen", help="overrides node_agent.listen (HOST:PORT of probes and /metrics)")
    p.add_argument("--dry-run", action="store_true", help="decide, log and count; patch nothing")
    p.set_defaults(func=_cmd_node_agent)

    p = sub.add_parser("plan", help="one-shot: print what the controller would do now; changes nothing")
    _add_common(p)
    p.add_argument("--prometheus-url", help="overrides prometheus.url")
    p.add_argument("--output", "-o", choices=["json", "table"], default="table")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser(
        "preflight",
        help="what the cluster already runs and what an install would collide with or miss",
        description="Read (never write) the cluster and its Prometheus: APIService owners, the NVIDIA device "
        "plugin on GPU nodes, dcgm-exporter's label style and missing fields, the control plane's version; "
        "each finding with the chart value to set (docs/install.md).",
    )
    _add_common(p)
    p.add_argument("--prometheus-url", help="overrides prometheus.url")
    p.add_argument("--strict", action="store_true", help="exit 1 when a finding is a conflict")
    p.add_argument(
        "--claims",
        help="comma-separated APIServices the install registers (the chart's hook passes its own; empty: "
        "none); default: judged as the chart's defaults",
    )
    p.add_argument(
        "--take-over",
        action="store_true",
        help="the install takes claimed APIServices over (apiServices.takeOver)",
    )
    p.set_defaults(func=_cmd_preflight)

    p = sub.add_parser(
        "uninstall",
        help="lift what gpuwarden wrote (taints, conditions, annotations, DeviceTaintRules, Lease)",
        description="Stop the controller (scale to 0) and the node agent (its DaemonSet deleted), then lift "
        "exactly what gpuwarden wrote on objects it does not own: its taints, GPUHealthy/GPUDegraded/"
        "NVLinkDomainHealthy conditions, its NVLink-domain label, annotations, its DeviceTaintRules, its "
        "Lease and breaker ConfigMap (docs/uninstall.md). "
        "The chart runs it as a pre-delete hook.",
    )
    _add_common(p)
    p.add_argument("--namespace", help="the release namespace (default: kubernetes.namespace)")
    p.add_argument("--node-agent-namespace", default="gpuwarden-node", help="default %(default)s")
    p.add_argument("--keep-running", action="store_true", help="do not stop the controller and node agent")
    p.add_argument("--dry-run", action="store_true", help="print what would be lifted; change nothing")
    p.set_defaults(func=_cmd_uninstall)

    p = sub.add_parser("check-config", help="validate a config file; every error at once, naming its field")
    p.add_argument("file", type=Path, help="the YAML config file to check")
    p.set_defaults(func=_cmd_check_config)

    p = sub.add_parser(
        "simulate",
        help="fleet simulator: dcgm-exporter-compatible metrics for a simulated GPU fleet",
        description="Serve dcgm-exporter metrics (and http_requests_total per pod) for a simulated fleet, "
        "driven by a scenario file and an HTTP control API under /control (see harness/simulator).",
    )
    p.add_argument("--scenario", type=Path, required=True, help="scenario YAML (see examples/scenarios/)")
    p.add_argument("--listen", default="127.0.0.1:9400", help="HOST:PORT to serve on (default %(default)s)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", choices=["json", "text", "auto"])
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("keda", help="KEDA tools (convert)", description="Tools for clusters running KEDA.")
    keda = p.add_subparsers(dest="keda_command", metavar="COMMAND", required=True)
    p = keda.add_parser(
        "convert",
        help="rewrite ScaledObjects' prometheus triggers as gpuwarden external triggers",
        description="Read Kubernetes YAML (ScaledObjects and anything else), rewrite each `prometheus` "
        "trigger whose query a gpuwarden preset answers with the same number into an `external` trigger "
        "served by the adapter's KEDA external scaler, and print the result on stdout; every other document "
        "and trigger is printed unchanged. stderr gets one line per prometheus trigger: converted (with "
        "notes) or kept, and why (docs/keda.md).",
    )
    p.add_argument("file", type=Path, help="YAML file with ScaledObjects, or - for stdin")
    p.add_argument("--config", type=Path, help="gpuwarden config whose adapter.presets the adapter runs with")
    p.add_argument(
        "--scaler-address",
        default="gpuwarden-keda.gpuwarden.svc:6000",
        help="scalerAddress of the converted triggers (default %(default)s)",
    )
    p.add_argument(
        "--auth-ref",
        help="TriggerAuthentication for mutual TLS (caCert, tlsClientCert, tlsClientKey) set on the "
        "converted triggers (replaces their Prometheus authenticationRef)",
    )
    p.add_argument(
        "--transport",
        choices=["tls", "tls-unverified", "plaintext"],
        default="tls",
        help="tls: enableTLS (verify with caCert from --auth-ref, or the system CAs); tls-unverified: also "
        "unsafeSsl, for the adapter's self-signed default certificate; plaintext: adapter.keda.tls.plaintext "
        "(default %(default)s)",
    )
    p.add_argument("--push", action="store_true", help="external-push triggers (activate from zero at once)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any prometheus trigger was kept")
    p.set_defaults(func=_cmd_keda_convert)

    p = sub.add_parser("dra", help="DRA tools (claim-template)", description="Tools for DRA-backed GPUs.")
    dra = p.add_subparsers(dest="dra_command", metavar="COMMAND", required=True)
    p = dra.add_parser(
        "claim-template",
        help="print a ResourceClaimTemplate that asks DRA for aligned GPUs",
        description="On DRA-backed nodes the scheduler's DRA plugin picks the devices and the claim it "
        "generates for nvidia.com/gpu has no topology constraint. Print a ResourceClaimTemplate that asks "
        "for N devices sharing resource.kubernetes.io/numaNode (single-numa; Kubernetes 1.37+, the driver "
        "must publish it) or resource.kubernetes.io/pcieRoot (single-pcie), aligned-if-possible "
        "(prefer-numa, a prioritized list) or unconstrained (none), with the pod fragment that uses it "
        "(docs/extender.md#topology-on-dra-nodes).",
    )
    p.add_argument("--gpus", type=int, required=True, help="number of GPUs (devices) the claim asks for")
    p.add_argument(
        "--policy",
        default="single-numa",
        help="single-numa, single-pcie, prefer-numa or none (default %(default)s)",
    )
    p.add_argument(
        "--device-class",
        default="gpu.nvidia.com",
        help="DeviceClass of the GPUs (default %(default)s, NVIDIA's DRA driver)",
    )
    p.add_argument("--namespace", default="default", help="namespace of the template (default %(default)s)")
    p.add_argument("--name", help="template name (default gpus-<n>-<policy>)")
    p.set_defaults(func=_cmd_dra_claim_template)

    p = sub.add_parser("demo", help="run the main job on a local kwok GPU fleet and write a report")
    p.add_argument("--scenario", type=Path, help="scripted demo scenario (default: the one in the repo)")
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep everything running after the demo (Ctrl-C ends)",
    )
    p.add_argument("--out", type=Path, help="report folder (default: demo-report-<timestamp>/)")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args: Any = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
