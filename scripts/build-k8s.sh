#!/usr/bin/env bash
# Builds the test control plane -- etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and kubectl -- and the real-cluster harness's node programs --
# kubelet, kube-proxy and the test image program agnhost -- and Kubernetes' own e2e
# suite (e2e.test, for `make conformance`) from their upstream Go
# modules at the versions pinned in e2e/controlplane/go/go.mod, plus helm at
# HELM_VERSION and CoreDNS at COREDNS_VERSION, into one folder the tests find
# (docs/controlplane.md, docs/real-cluster.md).
#
# Like envtest: if RINGLB_K8S_ASSETS or KUBEBUILDER_ASSETS names a folder that already
# holds the programs, nothing is built. Otherwise the output goes to
#   ${XDG_CACHE_HOME:-$HOME/.cache}/ringlb/k8s-<version>/
# and is reused while it is complete (a stamp file records the go.mod/go.sum it came
# from). Prints the folder on its last line.
set -euo pipefail
# Go from the machine image, where a login shell would find it.
[ -x /usr/local/go/bin/go ] && PATH=$PATH:/usr/local/go/bin
cd "$(dirname "$0")/.."
MOD=e2e/controlplane/go
PROGS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)
# The real cluster's node programs (scripts/build-test-images.sh packs agnhost).
NODE_PROGS=(kubelet kube-proxy agnhost coredns e2e.test)
# helm and CoreDNS are their own modules, built with `go install` at these versions.
HELM_VERSION=v3.22.0
COREDNS_VERSION=v1.12.4

have_all() {
  local d=$1
  for p in "${PROGS[@]}"; do [ -x "$d/$p" ] || return 1; done
}

for var in RINGLB_K8S_ASSETS KUBEBUILDER_ASSETS; do
  dir=${!var:-}
  if [ -n "$dir" ]; then
    if have_all "$dir"; then
      echo "build-k8s: using $var=$dir (nothing built; helm from there if present)" >&2
      echo "$dir"
      exit 0
    fi
    echo "build-k8s: $var=$dir lacks one of ${PROGS[*]}; building into the cache instead" >&2
  fi
done

version=$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$MOD/go.mod")
# K8S_VERSION=v1.N.M builds another version (for the version matrix in
# docs/controlplane.md) from a copy of the module with every pin moved to it.
if [ -n "${K8S_VERSION:-}" ] && [ "$K8S_VERSION" != "$version" ]; then
  staging=v0.${K8S_VERSION#v1.}
  tmp=$(mktemp -d)
  cp "$MOD/go.mod" "$MOD/tools.go" "$tmp/"
  sed -i -e "s#^\(\s*k8s.io/kubernetes\) v.*#\1 $K8S_VERSION#" \
         -e "s#^\(\s*k8s.io/[a-z-]* => k8s.io/[a-z-]*\) v0\..*#\1 $staging#" "$tmp/go.mod"
  (cd "$tmp" && GOFLAGS=-mod=mod go mod tidy >&2)
  MOD=$tmp
  version=$K8S_VERSION
fi
out=${XDG_CACHE_HOME:-$HOME/.cache}/ringlb/k8s-$version
stamp=$( (cat "$MOD/go.mod" "$MOD/go.sum"; echo "helm $HELM_VERSION, coredns $COREDNS_VERSION, version-stamped") | sha256sum | cut -c1-16)
have_node_progs() {
  local p
  for p in "${NODE_PROGS[@]}"; do [ -x "$1/$p" ] || return 1; done
}
if have_all "$out" && have_node_progs "$out" && [ -x "$out/helm" ] && [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "build-k8s: $out is current ($version)" >&2
  echo "$out"
  exit 0
fi

command -v go >/dev/null || { echo "build-k8s: Go is not installed (need Go >= 1.24)" >&2; exit 1; }
mkdir -p "$out"
echo "build-k8s: building Kubernetes $version control plane into $out (first time: ~10-15 min on 2 cores)" >&2
start=$(date +%s)
cd "$MOD"
export GOFLAGS=-mod=mod
# Stamp the version as upstream's release build does, so `kubectl version` and the
# API server's /version say v1.N.M instead of v0.0.0-master.
minor=${version#v1.}; minor=${minor%%.*}
vflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  vflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
build() { go build -trimpath -ldflags "-s -w$vflags" -o "$out/$1" "$2"; }
build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
build kubectl k8s.io/kubernetes/cmd/kubectl
build kubelet k8s.io/kubernetes/cmd/kubelet
build kube-proxy k8s.io/kubernetes/cmd/kube-proxy
# agnhost runs inside a minimal image: static, no cgo.
CGO_ENABLED=0 build agnhost k8s.io/kubernetes/test/images/agnhost
# The upstream e2e suite is a test binary: `go test -c`, stamped like the rest.
go test -c -trimpath -ldflags "-s -w$vflags" -o "$out/e2e.test" k8s.io/kubernetes/test/e2e
GOBIN=$out go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
GOBIN=$out go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
echo "$stamp" > "$out/.stamp"
echo "build-k8s: built in $(( $(date +%s) - start )) s" >&2
echo "$out"
