"""The simulator's HTTP control API: typed request bodies, validation, and JSON views of the fleet.

Why it exists: tests and the demo change the simulated world while Prometheus scrapes it — inject an XID,
take a node's exporter down, ramp a workload's load, map the pods the scheduler just bound to their GPUs.
Bodies are pydantic models with unknown keys rejected; a bad body is a 400 naming the field. Every call
goes through `Simulator.with_fleet`, which advances the fleet to "now" first; every change bumps the fleet's
version, which invalidates the cached /metrics body, so the next scrape shows it.
Endpoints (JSON in, JSON out):

    POST   /control/faults   one fault object or a list; same schema as a scenario fault, minus `at`
                             e.g. {"kind": "xid", "node": "gpu-node-003", "gpu": 5, "code": 79}
                             kinds: xid(code,count,instance?: MIG instance position) ecc(error=sbe|dbe,count)
                             retired_pages(sbe,dbe,pending) remapped_rows(correctable,uncorrectable)
                             row_remap_failure(duration?) gpu_missing(duration?)
                             exporter_down(duration?; no gpu)   -> {"applied": n}
    DELETE /control/faults   {"node"?, "gpu"?, "reset"?: bool} ends conditions (exporter down, GPU missing,
                             row-remap failure) on the target (default: everywhere); `reset` also simulates a
                             GPU reset: clears the sticky XID, the XID window, volatile ECC and pending pages
    POST   /control/load     {"namespace"?, "workload", "qps"} or {..., "points": [{"at": "0s", "qps": 10},
                             ...], "loop"?} (times relative to now), optional "qps_per_gpu",
                             "memory_mib_per_gpu", "engine" ("vllm" or "tgi": engine series per pod and
                             the workload's router_queue_depth); creates the workload if it does not exist
    PUT    /control/pods     {"pods": [{"namespace", "pod", "node", "gpus": [0, 1], "workload",
                             "container"?, "slots"?}]} makes this the whole pod->GPU mapping (pods not
                             listed go away); on a shared node `slots` names the replica (time-slicing) or
                             MIG instance position held on each listed GPU (default: the lowest free), and
                             `gpus` may list a GPU twice
    POST   /control/pods     same body; adds or moves only the listed pods
    DELETE /control/pods     {"pods": [{"namespace", "pod"}]} removes pods (their series disappear)
    GET    /control/state    time, conditions, unhealthy GPUs, workloads, pods
    GET    /control/nodes/{node}  one node: exporter state, every GPU (identity, NUMA node, gauges, counters;
                             time-sliced: `replicas`, `holders`; MIG: `mig_instances` with GPU_I_ID, profile,
                             MIG UUID and holder); /control/state lists each pod's `slots` and `devices` (the
                             device IDs PodResources would report: UUID, `<uuid>::<n>` or MIG UUID)

Errors: 400 {"error": "...", "problems": [{"field", "message"}]}; 404 unknown node; 409 a GPU claimed twice.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from aiohttp import web
from pydantic import Field, TypeAdapter, ValidationError, model_validator

from gpuwarden.config.base import Section
from harness.simulator.fleet import Fleet, MappingError, PodSpec
from harness.simulator.hardware import Gpu
from harness.simulator.scenario import Duration, Fault, LoadPoint, fault_adapter, problems_of
from harness.simulator.workload import LoadCurve

if TYPE_CHECKING:
    from harness.simulator.server import Simulator


class ClearFaults(Section):
    node: str | None = None
    gpu: int | None = Field(None, ge=0)
    reset: bool = False


class SetLoad(Section):
    namespace: str = "default"
    workload: str = Field(min_length=1)
    qps: float | None = Field(None, ge=0)
    points: list[LoadPoint] | None = Field(None, min_length=1)
    loop: Duration | None = Field(None, gt=0)
    qps_per_gpu: float | None = Field(None, gt=0)
    memory_mib_per_gpu: int | None = Field(None, ge=0)
    engine: Literal["vllm", "tgi"] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> SetLoad:
        if (self.qps is None) == (self.points is None):
            raise ValueError("give exactly one of `qps` or `points`")
        return self


class PodMapping(Section):
    namespace: str = "default"
    pod: str = Field(min_length=1)
    node: str
    gpus: list[int] = Field(min_length=1)
    workload: str = Field(min_length=1, description="workload (Deployment) whose load the pod shares")
    container: str | None = None
    slots: list[int] | None = Field(
        None, description="shared nodes: replica or MIG instance position per entry of `gpus`"
    )


class PodMappings(Section):
    pods: list[PodMapping]


class PodRef(Section):
    namespace: str = "default"
    pod: str


class PodRefs(Section):
    pods: list[PodRef]


_fault_list: TypeAdapter[list[Fault]] = TypeAdapter(list[Fault])


class BadRequest(Exception):
    def __init__(self, problems: list[tuple[str, str]], status: int = 400) -> None:
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))
        self.problems = problems
        self.status = status


def error_response(exc: BadRequest) -> web.Response:
    body = {"error": str(exc), "problems": [{"field": f, "message": m} for f, m in exc.problems]}
    return web.json_response(body, status=exc.status)


async def _json(request: web.Request) -> Any:
    text = await request.text()
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest([("(body)", f"not valid JSON: {exc}")]) from None


T = TypeVar("T")


def _validate(adapter: TypeAdapter[T], data: Any) -> T:
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise BadRequest(problems_of(exc)) from None


def parse_faults(data: Any, fleet: Fleet) -> list[Fault]:
    """A fault object or a list of them, with `at` refused and targets checked against the fleet."""
    faults = [_validate(fault_adapter, data)] if isinstance(data, dict) else _validate(_fault_list, data)
    problems = []
    for i, f in enumerate(faults):
        where = "" if isinstance(data, dict) else f"[{i}]"
        if f.at:
            problems.append(
                (f"{where}.at".lstrip("."), "not allowed here: control-API faults apply immediately")
            )
        problem = fleet.target_problem(f.node, getattr(f, "gpu", None), getattr(f, "instance", None))
        if problem:
            problems.append((f"{where}.{problem[0]}".lstrip("."), problem[1]))
    if problems:
        raise BadRequest(problems)
    return faults


def gpu_json(g: Gpu) -> dict[str, Any]:
    return {
        "gpu": g.index,
        "uuid": g.uuid,
        "pci_bus_id": g.pci_bus_id,
        "numa_node": g.numa_node,
        "present": g.present,
        "pod": f"{g.pod.namespace}/{g.pod.name}" if g.pod else None,
        "util": round(g.util, 3),
        "fb_used_mib": g.fb_used_mib,
        "power_w": round(g.power_w, 3),
        "temp_c": g.temp_c,
        "last_xid": g.last_xid,
        "xid_window": [code for _, code in g.xid_events],
        "ecc_sbe_vol": g.ecc_sbe_vol,
        "ecc_dbe_vol": g.ecc_dbe_vol,
        "ecc_sbe_agg": g.ecc_sbe_agg,
        "ecc_dbe_agg": g.ecc_dbe_agg,
        "retired_sbe": g.retired_sbe,
        "retired_dbe": g.retired_dbe,
        "retired_pending": g.retired_pending,
        "remapped_correctable": g.remapped_correctable,
        "remapped_uncorrectable": g.remapped_uncorrectable,
        "row_remap_failure": g.row_remap_failure,
        **sharing_json(g),
    }


def sharing_json(g: Gpu) -> dict[str, Any]:
    """A shared GPU's replicas or MIG instances and who holds them; nothing for a whole GPU."""
    if g.instances:
        return {
            "mig_instances": [
                {
                    "instance": inst.position,
                    "gpu_i_id": inst.gi_id,
                    "profile": inst.profile,
                    "mig_uuid": inst.mig_uuid,
                    "pod": f"{inst.pod.namespace}/{inst.pod.name}" if inst.pod else None,
                    "util": round(inst.util, 3),
                    "fb_used_mib": inst.fb_used_mib,
                    "last_xid": inst.last_xid,
                }
                for inst in g.instances
            ]
        }
    if g.replicas > 1:
        return {
            "replicas": g.replicas,
            "holders": [{"replica": n, "pod": f"{p.namespace}/{p.name}"} for n, p in g.holders],
        }
    return {}


def _unhealthy(g: Gpu) -> bool:
    return bool(
        not g.present
        or g.last_xid is not None
        or any(inst.last_xid is not None for inst in g.instances)
        or g.ecc_sbe_agg
        or g.ecc_dbe_agg
        or g.retired_sbe
        or g.retired_dbe
        or g.retired_pending
        or g.remapped_correctable
        or g.remapped_uncorrectable
        or g.row_remap_failure
    )


def state_json(fleet: Fleet) -> dict[str, Any]:
    """A summary small enough for 40k GPUs: only GPUs with a fault history are listed individually."""
    return {
        "time": fleet.now - fleet.start,
        "version": fleet.version,
        "nodes": len(fleet.nodes),
        "gpus_per_node": fleet.scenario.fleet.gpus_per_node,
        "exporters_down": [n.name for n in fleet.nodes.values() if not n.exporter_up],
        "conditions": [
            {"kind": k, "node": n, "gpu": g, "expires_in": None if at is None else at - fleet.now}
            for k, n, g, at in fleet.active_conditions()
        ],
        "unhealthy_gpus": [
            {"node": n.name, **gpu_json(g)} for n in fleet.nodes.values() for g in n.gpus if _unhealthy(g)
        ],
        "workloads": [
            {
                "namespace": w.namespace,
                "workload": w.name,
                "qps": w.curve.qps(fleet.now),
                "pods": len(w.pods),
                "qps_per_gpu": w.qps_per_gpu,
            }
            for w in fleet.workloads.values()
        ],
        "pods": [
            {
                "namespace": p.namespace,
                "pod": p.name,
                "container": p.container,
                "workload": p.workload.name,
                "node": p.node,
                "gpus": list(p.gpus),
                **({"slots": list(p.slots)} if p.slots else {}),
                "devices": fleet.device_ids(p),
                "requests": int(p.requests),
                "gpu_util": p.gpu_util(fleet.now),
            }
            for p in fleet.pods.values()
        ],
    }


def node_json(fleet: Fleet, name: str) -> dict[str, Any]:
    node = fleet.nodes[name]
    return {"name": name, "exporter_up": node.exporter_up, "gpus": [gpu_json(g) for g in node.gpus]}


def add_routes(app: web.Application, sim: Simulator) -> None:
    """Register the /control endpoints on `app`, acting on `sim`."""

    async def post_faults(request: web.Request) -> web.Response:
        data = await _json(request)
        faults = parse_faults(data, sim.fleet)

        def apply(f: Fleet) -> None:
            for fault in faults:
                f.apply_fault(fault, f.now)

        await sim.with_fleet(apply)
        return web.json_response({"applied": len(faults), "time": sim.fleet.now - sim.fleet.start})

    async def delete_faults(request: web.Request) -> web.Response:
        body = _validate(TypeAdapter(ClearFaults), await _json(request))
        if body.node is not None and (problem := sim.fleet.target_problem(body.node, body.gpu)):
            raise BadRequest([problem])
        if body.node is None and body.gpu is not None:
            raise BadRequest([("gpu", "needs `node`")])
        cleared = await sim.with_fleet(lambda f: f.clear_faults(body.node, body.gpu, reset=body.reset))
        return web.json_response({"cleared": cleared})

    async def post_load(request: web.Request) -> web.Response:
        body = _validate(TypeAdapter(SetLoad), await _json(request))

        def apply(f: Fleet) -> float:
            points = (
                ((0.0, body.qps),)
                if body.qps is not None
                else tuple((p.at, p.qps) for p in body.points or [])
            )
            w = f.set_load(
                body.namespace,
                body.workload,
                LoadCurve(points, f.now, body.loop),
                qps_per_gpu=body.qps_per_gpu,
                memory_mib_per_gpu=body.memory_mib_per_gpu,
                engine=body.engine,
            )
            return w.curve.qps(f.now)

        qps = await sim.with_fleet(apply)
        return web.json_response({"namespace": body.namespace, "workload": body.workload, "qps": qps})

    async def set_pods(request: web.Request) -> web.Response:
        body = _validate(TypeAdapter(PodMappings), await _json(request))
        specs = [
            PodSpec(
                p.namespace,
                p.pod,
                p.node,
                tuple(p.gpus),
                p.workload,
                p.container,
                tuple(p.slots) if p.slots is not None else None,
            )
            for p in body.pods
        ]
        try:
            await sim.with_fleet(lambda f: f.set_pods(specs, replace=request.method == "PUT"))
        except MappingError as exc:
            raise BadRequest(
                [(exc.field, str(exc).split(": ", 1)[1])], 409 if exc.conflict else 400
            ) from None
        return web.json_response({"pods": len(sim.fleet.pods)})

    async def delete_pods(request: web.Request) -> web.Response:
        body = _validate(TypeAdapter(PodRefs), await _json(request))
        removed = await sim.with_fleet(lambda f: f.unmap_pods((p.namespace, p.pod) for p in body.pods))
        return web.json_response({"removed": removed})

    async def get_state(request: web.Request) -> web.Response:
        return web.json_response(await sim.with_fleet(state_json))

    async def get_node(request: web.Request) -> web.Response:
        name = request.match_info["node"]
        if name not in sim.fleet.nodes:
            raise BadRequest([("node", f"unknown node {name!r}")], 404)
        return web.json_response(await sim.with_fleet(lambda f: node_json(f, name)))

    @web.middleware
    async def bad_requests(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except BadRequest as exc:
            return error_response(exc)

    app.middlewares.append(bad_requests)
    app.router.add_post("/control/faults", post_faults)
    app.router.add_delete("/control/faults", delete_faults)
    app.router.add_post("/control/load", post_load)
    app.router.add_put("/control/pods", set_pods)
    app.router.add_post("/control/pods", set_pods)
    app.router.add_delete("/control/pods", delete_pods)
    app.router.add_get("/control/state", get_state)
    app.router.add_get("/control/nodes/{node}", get_node)
