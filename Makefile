# The verbs a person types. `make test` is exactly what CI runs.
.PHONY: test setup setup-demo k8s fmt lint unit crds help demo

# cargo: from PATH, else ~/.cargo/bin. `sudo make demo` runs with sudo's secure_path
# and HOME=/root, so also look in the invoking user's ~/.cargo/bin and use that
# user's toolchains (RUSTUP_HOME) and registry cache (CARGO_HOME).
SUDO_HOME := $(if $(SUDO_USER),$(shell getent passwd $(SUDO_USER) | cut -d: -f6))
CARGO ?= $(or $(shell command -v cargo 2>/dev/null),$(wildcard $(HOME)/.cargo/bin/cargo),$(if $(SUDO_HOME),$(wildcard $(SUDO_HOME)/.cargo/bin/cargo)),cargo)
ifneq ($(SUDO_HOME),)
ifeq ($(CARGO),$(SUDO_HOME)/.cargo/bin/cargo)
export RUSTUP_HOME ?= $(SUDO_HOME)/.rustup
export CARGO_HOME ?= $(SUDO_HOME)/.cargo
endif
endif
# scripts/setup.sh runs cargo and rustup: put the cargo found above on their PATH.
ifneq ($(filter /%,$(CARGO)),)
export PATH := $(patsubst %/,%,$(dir $(CARGO))):$(PATH)
endif
# Where cargo builds; honours CARGO_TARGET_DIR like cargo does.
CARGO_TARGET_DIR ?= target

help:
	@echo "make test   - set up (apt) + fmt check + clippy + all tests (what CI runs)"
	@echo "make check  - fmt check + clippy + the tests that need no root, apt or Go (the quick tier)"
	@echo "make crds   - regenerate crds/*.yaml and the chart's copy from the Rust types"
	@echo "make setup  - install the Debian packages and Rust tools the tests need (idempotent)"
	@echo "make setup-demo - only what the demo needs (a subset of setup)"
	@echo "make k8s    - build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl from Go modules (cached)"
	@echo "make demo   - (root) the real cluster: helm install, a LoadBalancer Service, traffic through the edges to the pods, DSR"
	@echo "make lab-demo - (root) the namespace lab without kubelets (docs/lab.md)"
	@echo "make conformance - (root) Kubernetes' LoadBalancer and Services conformance e2e tests against ringlb (docs/conformance.md)"

setup:
	bash scripts/setup.sh test

setup-demo:
	bash scripts/setup.sh demo

# The real control plane the tests run against (docs/controlplane.md).
k8s:
	bash scripts/build-k8s.sh

fmt:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Every test, also those the default filter leaves out of a plain `cargo nextest
# run` because they need root (.config/nextest.toml); under CI=true a test that
# would skip itself fails instead.
unit:
	$(CARGO) nextest run --workspace --no-fail-fast --ignore-default-filter

# The quick tier: no root, no apt, no Go. The nextest profile `check` leaves out
# the tests that need root and those against the real control plane
# (.config/nextest.toml); building still needs clang for the BPF programs.
.PHONY: check
check: fmt lint
	$(CARGO) nextest run --workspace --no-fail-fast --profile check

test: setup k8s cluster-images fmt lint unit kernels ipvs-vm

# make test's images carry dev-profile binaries out of the workspace's test build,
# which the unit step needs anyway: no second full compile (a cold release build is
# about 7 minutes here). `make images`, `make demo` and `make conformance` build
# release images.
test: IMAGES_PROFILE = dev

crds:
	$(CARGO) run -q -p ringlb-crds --bin crdgen

# The real cluster (needs root): kubelet + containerd nodes, kube-proxy, CoreDNS and a
# BIRD ToR in namespaces; ringlb installed by helm from the images built here; a
# dual-stack LoadBalancer Service and traffic, each step with its evidence; torn down
# at the end (`ringlb-lab cluster-demo --keep` leaves it up until Ctrl-C).
# docs/real-cluster.md.
demo: setup-demo k8s cluster-images
	$(CARGO) build -q -p ringlb-e2e --bin ringlb-lab
	$(CARGO_TARGET_DIR)/debug/ringlb-lab cluster-demo

# Kubernetes' own e2e suite against ringlb on the real cluster (root): every
# [Feature:LoadBalancer] test and the Services conformance tests, from a client behind
# the ToR; then no address, route or BPF entry may be left. PROXY_MODE=nftables runs
# kube-proxy in that mode. Report: target/conformance/<mode>/. docs/conformance.md.
PROXY_MODE ?= iptables
.PHONY: conformance
conformance: setup-demo k8s cluster-images
	$(CARGO) build -q -p ringlb-e2e --bin ringlb-lab
	$(CARGO_TARGET_DIR)/debug/ringlb-lab --prefix rlb-conf conformance --proxy-mode $(PROXY_MODE) \
		--report-dir $(CARGO_TARGET_DIR)/conformance

# The older namespace lab with the programs run directly (no kubelet); docs/lab.md.
.PHONY: lab-demo
lab-demo: setup-demo k8s
	$(CARGO) build -p ringlb-e2e -p ringlb-controller -p ringlb-edge --bins
	$(CARGO_TARGET_DIR)/debug/ringlb-lab demo

# The images the real cluster's nodes import: ringlb's (`make images`) and the
# upstream pause and agnhost (scripts/build-test-images.sh); each step is skipped
# while its output is current.
.PHONY: cluster-images
cluster-images: images
	bash scripts/build-test-images.sh >/dev/null

# Container images without a registry or engine (root: debootstrap, umoci, skopeo,
# chroot): images/out/oci/<program> and images/out/<program>-<version>.tar; see
# docs/images.md. `RINGLB_IMAGES=1 cargo nextest run -p ringlb-testkit --test images`
# re-checks the result. IMAGES_PROFILE=dev builds the binaries with the dev profile.
IMAGES_PROFILE ?= release
.PHONY: images
images:
	CARGO=$(CARGO) bash scripts/build-images.sh --profile $(IMAGES_PROFILE)

# A first install from this checkout, timed phase by phase: images, the Go build,
# the real control plane, `helm install`, the controller pod run from its image as
# the kubelet would, `kubectl expose --type=LoadBalancer` until the VIP (root;
# docs/install.md, "How long a first install takes"). Leaves nothing running.
.PHONY: first-install
first-install:
	CARGO=$(CARGO) bash scripts/first-install.sh

# The kernel test matrix (root): the XDP and tc BPF tests inside stock Debian
# kernels 5.10, 6.1, 6.12 and the newest, under qemu; kernels are cached in
# ~/.cache/ringlb/kernels. docs/kernels.md.
.PHONY: kernels
kernels:
	bash scripts/kernel-setup.sh
	$(CARGO) run -q -p ringlb-kernels --bin kernel-matrix -- --out $(CARGO_TARGET_DIR)/kernel-matrix

# The IPVS lab in a VM (root): the namespace lab with both edges on
# `--datapath ipvs`, a BIRD ToR with ECMP and three worker nodes, inside one
# matrix kernel (6.12) under qemu; the control plane stays on the host.
# docs/lab.md, "The IPVS lab in a VM". Its programs come out of the workspace's
# test build (the same build as `make unit`'s, so after it nothing is compiled).
.PHONY: ipvs-vm
ipvs-vm: k8s
	bash scripts/kernel-setup.sh
	$(CARGO) test -q --no-run --workspace
	$(CARGO_TARGET_DIR)/debug/ringlb-lab ipvs-vm --kernel 6.12 --out $(CARGO_TARGET_DIR)/ipvs-vm
