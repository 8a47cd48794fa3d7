#!/usr/bin/env bash
# Idempotent set-up of everything `make test` and `make demo` need on a fresh Debian
# machine. Installs only what is missing; safe to run again.
set -euo pipefail
# Go from the machine image, where a login shell would find it.
[ -x /usr/local/go/bin/go ] && PATH=$PATH:/usr/local/go/bin

PKGS=(
  clang llvm libbpf-dev bpftool          # BPF C programs (xdp/bpf, testkit/bpf), object inspection
  bird2 gobgpd                           # real BGP peers for interop tests
  iproute2 iptables nftables tcpdump     # network-namespace lab, kube-proxy comparison
  iputils-ping curl python3 procps       # lab traffic and helpers
  ethtool                                # lab: TX checksum offload off on the client veth
  libclang-dev                           # (used by some -sys crates' build scripts)
)

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

# BIRD and gobgpd are only used as test peers: keep the packaged services from
# running on the host.
for svc in bird gobgpd; do
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

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest"
  cargo install --locked cargo-nextest
fi
for c in clippy rustfmt; do
  rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
done
echo "setup: ok"
