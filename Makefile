# The verbs a person types. `make test` is exactly what CI runs.
.PHONY: test setup fmt lint unit crds help

CARGO ?= cargo

help:
	@echo "make test   - set up (apt) + fmt check + clippy + all tests (what CI runs)"
	@echo "make crds   - regenerate crds/*.yaml and the chart's copy from the Rust types"
	@echo "make setup  - install the Debian packages the tests need (idempotent)"

setup:
	bash scripts/setup.sh

fmt:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) nextest run --workspace --no-fail-fast

test: setup fmt lint unit

crds:
	$(CARGO) run -q -p ringlb-crds --bin crdgen
