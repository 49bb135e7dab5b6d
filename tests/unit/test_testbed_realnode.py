"""The real-node harness's generated inputs: OCI archives, containerd and kubelet configuration, credentials.

The e2e proofs run all of this against the real containerd and kubelet; these tests pin the settings whose
absence is known to break this host (tests/testbed/README.md lists each with its error), so a refactor that
drops one fails here in milliseconds instead of as a hung node in the e2e tier.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from harness.testbed.images import PAUSE_IMAGE, TOOL_IMAGE, compile_static, oci_archive
from harness.testbed.pki import make_ca
from harness.testbed.realnode import RealNode, RealNodeSpec, write_kubelet_client_pki


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


@pytest.fixture
def fake_binary(tmp_path: Path) -> Path:
    path = tmp_path / "bin"
    path.write_bytes(b"\x7fELF not really")
    return path


@pytest.mark.parametrize("spec", [PAUSE_IMAGE, TOOL_IMAGE], ids=lambda s: s.binary)
def test_oci_archive_is_a_consistent_layout_named_for_containerd(spec, fake_binary: Path) -> None:  # type: ignore[no-untyped-def]
    files = _members(oci_archive(spec, fake_binary))
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    (desc,) = index["manifests"]
    assert desc["annotations"]["io.containerd.image.name"] == spec.name

    # Every descriptor points at a blob with that digest and size.
    def blob(d: dict[str, object]) -> bytes:
        data = files[f"blobs/sha256/{str(d['digest']).split(':', 1)[1]}"]
        assert len(data) == d["size"]
        assert "sha256:" + hashlib.sha256(data).hexdigest() == d["digest"]
        return data

    manifest = json.loads(blob(desc))
    config = json.loads(blob(manifest["config"]))
    (layer_desc,) = manifest["layers"]
    layer = gzip.decompress(blob(layer_desc))
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Entrypoint"] == [f"/{spec.binary}"]
    assert config["config"].get("User", "") == spec.user
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        (member,) = tar.getmembers()
        assert member.name == spec.binary and member.mode == 0o755
        assert tar.extractfile(member).read() == fake_binary.read_bytes()  # type: ignore[union-attr]


def test_oci_archive_is_deterministic(fake_binary: Path) -> None:
    assert oci_archive(TOOL_IMAGE, fake_binary) == oci_archive(TOOL_IMAGE, fake_binary)


def test_pause_image_runs_as_65535_like_upstream() -> None:
    assert PAUSE_IMAGE.user == "65535:65535"
    assert PAUSE_IMAGE.name.startswith("docker.io/")  # as the kubelet normalises references
    assert TOOL_IMAGE.name.startswith("docker.io/")


def test_images_compile_static_and_are_cached(tmp_path: Path) -> None:
    first = compile_static(TOOL_IMAGE, tmp_path)
    assert first.read_bytes()[:4] == b"\x7fELF"
    mtime = first.stat().st_mtime_ns
    again = compile_static(TOOL_IMAGE, tmp_path)
    assert again == first and again.stat().st_mtime_ns == mtime


def _node(tmp_path: Path) -> RealNode:
    ca = make_ca("test-cluster-ca")
    node = RealNode(
        RealNodeSpec(name="real-node-0"),
        kubelet_binary=Path("/nonexistent/kubelet"),
        ctl_binary=Path("/nonexistent/kubectl"),
        server="https://127.0.0.1:6443",
        cluster_ca=ca,
        kubelet_client_ca=tmp_path / "kubelet-client-ca.crt",
        cache_dir=tmp_path / "images",
    )
    node.node_ip = "192.0.2.2"
    node.kubelet_port = 21000
    node.healthz_port = 21001
    return node


def test_containerd_config_keeps_every_path_under_the_run_dir_and_the_cures_this_host_needs(
    tmp_path: Path,
) -> None:
    node = _node(tmp_path)
    try:
        conf = tomllib.loads(node.containerd_config())
        assert conf["version"] == 2
        for key in ("root", "state"):
            assert conf[key].startswith(str(node.run_dir))
        assert conf["grpc"]["address"] == str(node.containerd_socket)
        cri = conf["plugins"]["io.containerd.grpc.v1.cri"]
        assert cri["restrict_oom_score_adj"] is True  # runc: can't get final child's PID from pipe: EOF
        assert cri["sandbox_image"] == PAUSE_IMAGE.name  # no registry to pull registry.k8s.io/pause from
        assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
        assert cri["cni"]["conf_dir"].startswith(str(node.run_dir))
        assert len(str(node.containerd_socket)) < 100  # sun_path holds 108 bytes
        ipam = node.cni_conflist()["plugins"][0]["ipam"]
        assert ipam["dataDir"].startswith(str(node.run_dir))
        assert node.cni_conflist()["plugins"][0]["ipMasq"] is False  # no iptables binary needed
    finally:
        node.stop()
    assert not node.run_dir.exists()


def test_kubelet_configuration_for_this_host(tmp_path: Path) -> None:
    node = _node(tmp_path)
    try:
        cfg = node.kubelet_configuration()
    finally:
        node.stop()
    assert cfg["failCgroupV1"] is False  # hybrid cgroup v1 host; 1.35 refuses v1 by default
    assert cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["imageGCHighThresholdPercent"] == 100  # the offline pause image must never be collected
    assert cfg["imageGCLowThresholdPercent"] < cfg["imageGCHighThresholdPercent"]
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["authorization"]["mode"] == "Webhook"
    assert cfg["readOnlyPort"] == 0
    assert cfg["address"] == "192.0.2.2" and cfg["healthzBindAddress"] == "127.0.0.1"
    assert cfg["containerRuntimeEndpoint"] == f"unix://{node.containerd_socket}"
    assert {"key": "gpuwarden.io/real-kubelet", "value": "true", "effect": "NoSchedule"} in cfg[
        "registerWithTaints"
    ]
    assert "podInfraContainerImage" not in cfg  # removed in 1.35: the kubelet would refuse to start


def test_node_credentials_are_a_nodes_identity_signed_by_the_cluster_ca(tmp_path: Path) -> None:
    node = _node(tmp_path)
    try:
        kubeconfig = node._write_credentials()
        doc = yaml.safe_load(kubeconfig.read_text())
        user = doc["users"][0]["user"]
        cert = x509.load_pem_x509_certificate(Path(user["client-certificate"]).read_bytes())
        ca = x509.load_pem_x509_certificate(node._cluster_ca.cert_pem)
    finally:
        node.stop()
    assert doc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert cert.issuer == ca.subject
    # The Node authorizer and NodeRestriction key on exactly this: CN system:node:<name>, O system:nodes.
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:real-node-0"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"


def test_api_server_kubelet_client_identity(tmp_path: Path) -> None:
    pki = write_kubelet_client_pki(tmp_path, make_ca("kubelet-client-ca"))
    cert = x509.load_pem_x509_certificate(pki.client_cert.read_bytes())
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    assert cert.issuer == ca.subject
    assert (
        cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kube-apiserver-kubelet-client"
    )
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
