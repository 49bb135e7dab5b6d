"""GPU health quarantine: taint nodes whose GPUs show hardware XID / ECC failures — safely.

Pure core: `catalog` (what an XID means), `findings` (what is wrong with a node), `decide.plan_quarantine`
(what to do, with a reason for every action and skip). Thin shell: `observe` (Prometheus + API → snapshot),
`act` (plan → patches and Events, honouring dry-run), `loop` (the leader-elected periodic loop).
This package never imports `adapter`.
"""
