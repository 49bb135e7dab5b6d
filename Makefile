# gpuwarden — the two set-up commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST := $(PY) -m pytest
STAMP := $(VENV)/.installed

.PHONY: help lock deps protos keda-protos prometheus node-runtime testbed testbed-oldest helm upstream-adapter promql-check keda-client keda karpenter e2e-karpenter kueue lint unit integration rules-test e2e test test-oldest bench demo clean image-tools image-lock wheelhouse image image-test release

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' Makefile | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# requirements.lock pins every transitive dependency (regenerate: `make lock`).
$(STAMP): pyproject.toml requirements.lock
	@echo "==> installing Python dependencies into $(VENV)"
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -c requirements.lock -e '.[test,dev,demo]'
	@# the harness (harness/) is not part of the distribution: a .pth file puts the checkout on the path
	$(PY) -c 'import site, pathlib; pathlib.Path(site.getsitepackages()[0], "gpuwarden-harness.pth").write_text("$(CURDIR)\n")'
	touch $(STAMP)

lock: ## regenerate requirements.lock from a fresh resolve of pyproject.toml
	rm -rf .venv-lock && python3 -m venv .venv-lock
	.venv-lock/bin/pip install -q '.[test,dev,demo]'
	.venv-lock/bin/pip freeze --exclude-editable | grep -v '^gpuwarden' > requirements.lock
	rm -rf .venv-lock

deps: $(STAMP) ## Python virtualenv with pinned dependencies

prometheus: ## install the Debian prometheus package (server + promtool) when missing
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
	  echo "==> installing prometheus (Debian package)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  systemctl stop prometheus 2>/dev/null || true; pkill -x prometheus 2>/dev/null || true; }
	@prometheus --version 2>&1 | head -1

# The real kubelet node of the test bed (tests/testbed/README.md): Debian's containerd 1.6 and runc, the CNI
# plugins (bridge, host-local, loopback in /usr/lib/cni), gcc + static libc for the pause and tool images,
# iproute2 for the bridge cleanup. containerd is started by the harness with its own config; the package's
# service is never used (and is stopped if a service manager started it).
NODE_PKGS := containerd runc containernetworking-plugins iproute2 gcc libc6-dev
node-runtime: ## install containerd, runc, CNI plugins, gcc (Debian packages) for the real kubelet node
	@missing=""; for p in $(NODE_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "==> installing$$missing (Debian packages)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  systemctl stop containerd 2>/dev/null || true; \
	fi
	@containerd --version; runc --version | head -1; ls /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback >/dev/null

protos: deps ## regenerate the kubelet gRPC stubs (nodeagent/kubeletapi) and our Kubernetes wire-type subsets (k8spb, podpb)
	bash tests/testbed/kubelet-protos.sh
	bash tests/testbed/k8s-protos.sh

keda-protos: deps ## regenerate KEDA's external-scaler gRPC stubs (adapter/kedaapi) from the KEDA module tests/keda pins
	bash tests/keda/protos.sh

testbed: ## build kube-apiserver, KCM, scheduler, kubectl, kubelet, etcd, kwok(ctl) into .cache/testbed
	bash tests/testbed/build.sh

testbed-oldest: ## the same for the oldest supported Kubernetes (tests/testbed/oldest), linked as .cache/testbed/oldest
	TESTBED_KUBE=oldest bash tests/testbed/build.sh

helm: ## build helm v3.22.0 from its Go module into .cache/helm (chart tests: deploy/helm/gpuwarden)
	bash tests/helm/build.sh

upstream-adapter: ## build prometheus-adapter v0.12.0 from its Go module into .cache/upstream (bench; e2e: test_beside_incumbents.py)
	bash tests/bench/upstream/build.sh

promql-check: ## build Prometheus' PromQL parser (tests/promql) into .cache/promqlcheck (PromQL property tests)
	bash tests/promql/build.sh

keda-client: ## build KEDA's external-scaler client (tests/keda: 4 of pkg/scalers' files) into .cache/kedaclient
	bash tests/keda/build.sh

# The image (deploy/Dockerfile, the one recipe) is built without a registry or a daemon: buildah 1.28 (vfs
# storage, chroot isolation: works as root here, no user namespaces or fuse needed) on a bookworm base made
# from Debian packages by mmdebstrap; umoci is not needed (the image tests read the OCI archive themselves).
IMAGE_PKGS := buildah mmdebstrap
image-tools: ## install buildah and mmdebstrap (Debian packages) to build the image
	@missing=""; for p in $(IMAGE_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "==> installing$$missing (Debian packages)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@buildah --version; mmdebstrap --version

image-lock: deps ## regenerate deploy/image/requirements*.txt (runtime closure of requirements.lock, with hashes)
	$(PY) deploy/image/lock.py

wheelhouse: deps ## download the image's hash-pinned wheels into build/wheelhouse (for `docker build`)
	bash deploy/image/build.sh --wheelhouse

image: deps image-tools ## build deploy/Dockerfile into an OCI archive under .cache/image/<content-key>/
	bash deploy/image/build.sh

release: image helm ## dist/<version>/: the chart packaged, the image archive, its SBOM, SHA256SUMS (docs/release.md)
	bash deploy/release.sh

image-test: deps image ## the built image: product only (no harness, tests, pip, compiler), every --help runs
	$(PYTEST) -q tests/image

keda: ## build the KEDA operator and metrics server (tests/keda/build-keda.sh) into .cache/keda (e2e)
	bash tests/keda/build-keda.sh

karpenter: ## build Karpenter's kwok cloud provider (tests/karpenter/build.sh) into .cache/karpenter (e2e: test_karpenter_*)
	bash tests/karpenter/build.sh

kueue: ## build Kueue's manager v0.17.0 (tests/kueue/build-kueue.sh) into .cache/kueue (e2e: test_kueue_domains.py)
	bash tests/kueue/build-kueue.sh

lint: deps ## ruff, mypy (strict), import-linter contracts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: deps ## pure cores, wire formats, respx error paths
	$(PYTEST) -q tests/unit

# test_dashboards_live runs in a pytest process of its own: after the other modules of the tier, its
# module-scoped event loop's teardown was seen to hang on this machine kind (the fake API server's watch
# handlers never finish; 3 of 3 full-tier runs on 2026-12-01, the module alone passes).
# The Go builds each tier needs; `make test` starts them all early (see test:).
INTEGRATION_BUILDS := promql-check keda-client
E2E_BUILDS := testbed helm keda kueue upstream-adapter
integration: deps prometheus $(INTEGRATION_BUILDS) ## against a real Prometheus server (its PromQL parser, KEDA's client)
	$(PYTEST) -q tests/integration --ignore=tests/integration/test_dashboards_live.py
	$(PYTEST) -q tests/integration/test_dashboards_live.py

rules-test: prometheus ## promtool check + test of rules/
	bash rules/test.sh

# test_installed_image runs in a pytest process of its own: it needs the machine's one real kubelet node (with
# kube-proxy and the image), which the other modules' session-wide node cluster holds until their session ends.
# The Karpenter suites (the real autoscaler, kwok provider) run by `make e2e-karpenter`, not here: the build is
# ~3.2 min with a warm Go build cache (more cold) and the suite ~4 min; see the README.
KARPENTER_SUITES := tests/e2e/test_karpenter_outcomes.py
e2e: deps prometheus node-runtime $(E2E_BUILDS) image ## against the real control plane and a real kubelet node
	$(PYTEST) -q --durations=15 tests/e2e --ignore=tests/e2e/test_installed_image.py $(addprefix --ignore=,$(KARPENTER_SUITES))
	$(PYTEST) -q tests/e2e/test_installed_image.py

e2e-karpenter: deps testbed karpenter ## the e2e suites with the real Karpenter (kwok provider) launching GPU nodes
	$(PYTEST) -q --durations=10 $(KARPENTER_SUITES)

# `make test` (harness/maketest.py): the virtualenv and Debian packages first, then the Go builds of
# INTEGRATION_BUILDS and E2E_BUILDS in the background, one at a time (logs in .cache/ci/), while the tiers run in
# order; integration and e2e wait for their builds. It stops at the first failure (a failed build's log tail is
# shown), prints each build's and tier's wall time, and exits with the failing make's status. The image is built
# by image-test in the foreground (buildah, not a Go build). `make e2e` alone still builds what it needs.
TEST_SETUP := deps prometheus node-runtime image-tools
TEST_TIERS := lint unit rules-test image-test integration e2e
test: ## every tier (what CI runs); Go builds started early in the background; times at the end
	@python3 -m harness.maketest --make "$(MAKE)" --setup "$(TEST_SETUP)" --builds "$(INTEGRATION_BUILDS) $(E2E_BUILDS)" \
	  --tiers "$(TEST_TIERS)" --needs "integration=$(INTEGRATION_BUILDS)" --needs "e2e=$(E2E_BUILDS)" --logs .cache/ci

# The contract suites on the oldest supported Kubernetes (README "Supported Kubernetes versions"): extender verbs
# and preemption against the real kube-scheduler, device plugin + PodResources + eviction against the real
# kubelet (and the node agent on it), HPA through the aggregator (a test server and our adapter). A target of
# its own, not part of `make test`: a second Kubernetes build costs ~6.5 min cold, these suites 2.2 min (25 tests).
CONTRACT_SUITES := tests/e2e/test_testbed_scheduler.py tests/e2e/test_testbed_aggregation.py \
	tests/e2e/test_testbed_hpa.py tests/e2e/test_extender_scheduler.py tests/e2e/test_gpu_preemption.py \
	tests/e2e/test_kubelet_node.py tests/e2e/test_node_agent.py tests/e2e/test_adapter_hpa.py
test-oldest: deps prometheus node-runtime testbed-oldest ## the contract suites on the oldest supported Kubernetes (v1.35.4)
	GPUWARDEN_TESTBED_BIN=$(CURDIR)/.cache/testbed/oldest/bin $(PYTEST) -q $(CONTRACT_SUITES)

bench: deps prometheus testbed helm upstream-adapter keda-client keda karpenter ## benchmarks, printed numbers
	$(PY) -m tests.bench

demo: deps prometheus testbed ## the main job on a local kwok GPU fleet, with a report
	$(VENV)/bin/gpuwarden demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
