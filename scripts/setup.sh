#!/usr/bin/env bash
# Idempotent set-up of what `make test` (profile `test`, the default) or `make demo`
# (profile `demo`) needs on a fresh Debian machine. Installs only what is missing;
# safe to run again.
#   scripts/setup.sh [test|demo]
set -euo pipefail
PROFILE=${1:-test}
# Go from the machine image, where a login shell would find it.
[ -x /usr/local/go/bin/go ] && PATH=$PATH:/usr/local/go/bin

# The demo (the namespace lab) builds the programs and runs them with a BIRD ToR.
DEMO_PKGS=(
  clang llvm libbpf-dev                  # BPF C programs (xdp/bpf, node/bpf, testkit/bpf)
  bird2                                  # the lab's ToR
  iproute2 nftables curl ethtool procps  # namespaces, the ToR's NAT, traffic, checksum offload off
  # the real cluster (docs/real-cluster.md): a container runtime and CNI per node,
  # kube-proxy's backends, and the images built without a registry or engine
  containerd runc containernetworking-plugins iptables conntrack
  debootstrap umoci skopeo gcc libc6-dev   # scripts/build-images.sh, scripts/build-test-images.sh
)
# The tests need more: interop peers, comparisons, inspection, the Rust tools.
TEST_PKGS=(
  bpftool                                # object inspection
  gobgpd                                 # real BGP peers for interop tests
  frr                                    # FRR bgpd + bfdd: BFD interop (edge-lb/tests/bgp_bfd_frr.rs)
  tcpdump                                # captures
  iputils-ping python3                   # helpers
  libclang-dev                           # (used by some -sys crates' build scripts)
  pdns-server pdns-backend-bind          # the two-region lab's GTM (PowerDNS, LUA records)
  bind9-dnsutils                         # dig, asking it
  binutils                               # strip: the IPVS VM lab's guest image (ringlb-lab ipvs-vm)
)
# cargo-nextest, pinned (the oldest that reads .config/nextest.toml is 0.9.91).
# Built with the dev profile and without the self-updater (its HTTP and archive
# crates), which a test machine never uses: the build is the first thing a fresh
# machine waits for, and nextest's own work is small beside the tests it runs.
NEXTEST_VERSION=0.9.151
case $PROFILE in
  demo) PKGS=("${DEMO_PKGS[@]}") ;;
  test) PKGS=("${DEMO_PKGS[@]}" "${TEST_PKGS[@]}") ;;
  *) echo "setup: unknown profile $PROFILE (test or demo)" >&2; exit 2 ;;
esac

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to apt-get install ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# BIRD, gobgpd, FRR, PowerDNS and containerd are only used by tests and labs: keep the
# packaged services from running on the host.
for svc in bird gobgpd frr pdns containerd; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc" || true
  fi
done

# kubectl, etcd, kube-apiserver and kube-controller-manager are built from their Go
# modules by scripts/build-k8s.sh (`make k8s`), not installed from apt: Debian's
# kubectl is 1.20 and Debian has no kube-apiserver.
if ! command -v go >/dev/null 2>&1; then
  echo "setup: Go is not on PATH; scripts/build-k8s.sh needs Go >= 1.24" >&2
  exit 1
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo is not on PATH (install Rust with rustup; under sudo, run make, which finds ~/.cargo/bin)" >&2
  exit 1
fi
if [ "$PROFILE" = demo ]; then
  echo "setup: ok (demo)"
  exit 0
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest $NEXTEST_VERSION"
  cargo install --locked --debug --version "$NEXTEST_VERSION" \
    --no-default-features --features default-no-update cargo-nextest
fi
for c in clippy rustfmt; do
  rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
done
echo "setup: ok"
