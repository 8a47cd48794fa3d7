# The verbs a person types. `make test` is exactly what CI runs.
.PHONY: test setup k8s fmt lint unit crds help demo

CARGO ?= cargo

help:
	@echo "make test   - set up (apt) + fmt check + clippy + all tests (what CI runs)"
	@echo "make crds   - regenerate crds/*.yaml and the chart's copy from the Rust types"
	@echo "make setup  - install the Debian packages the tests need (idempotent)"
	@echo "make k8s    - build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl from Go modules (cached)"
	@echo "make demo   - (root) the end-to-end lab: Service -> VIP -> BGP ECMP -> XDP edges -> pods, DSR"

setup:
	bash scripts/setup.sh

# The real control plane the tests run against (docs/controlplane.md).
k8s:
	bash scripts/build-k8s.sh

fmt:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) nextest run --workspace --no-fail-fast

test: setup k8s fmt lint unit

crds:
	$(CARGO) run -q -p ringlb-crds --bin crdgen

# The end-to-end lab in network namespaces (needs root); docs/lab.md.
demo: setup k8s
	$(CARGO) build -p ringlb-e2e -p ringlb-controller -p ringlb-edge --bins
	./target/debug/ringlb-lab demo
