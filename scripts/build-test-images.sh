#!/usr/bin/env bash
# Builds the two upstream images the real-cluster harness runs, with no registry and
# no container engine, under the exact names the kubelet and Kubernetes' e2e tests
# ask for, so nothing is ever pulled (docs/real-cluster.md):
#
#   registry.k8s.io/pause:3.10.1                     pause.c from the pinned
#       k8s.io/kubernetes module (build/pause/linux), gcc -static, alone in an image
#   registry.k8s.io/e2e-test-images/agnhost:2.56     agnhost from scripts/build-k8s.sh
#       on a Debian minbase root filesystem with the tools the e2e tests exec (curl,
#       Debian's wget set to one try as busybox's, netcat, iproute2, dig, ping)
#
# The tags are those of test/utils/image/manifest.go at the pinned version. Output:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/ringlb/test-images-<k8s version>/{pause,agnhost}.tar
# (docker archives for `ctr images import`), reused while the stamp matches. Prints the
# folder on its last line. Needs root (debootstrap, chroot).
set -euo pipefail
[ -x /usr/local/go/bin/go ] && PATH=$PATH:/usr/local/go/bin
cd "$(dirname "$0")/.."
MOD=e2e/controlplane/go
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PAUSE_TAG=3.10.1
AGNHOST_TAG=2.56
AGNHOST_PKGS=curl,wget,netcat-openbsd,iproute2,bind9-dnsutils,iputils-ping,ca-certificates

version=$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$MOD/go.mod")
assets=$(bash scripts/build-k8s.sh)
out=${XDG_CACHE_HOME:-$HOME/.cache}/ringlb/test-images-$version
stamp=$( (echo "$PAUSE_TAG $AGNHOST_TAG $AGNHOST_PKGS $SUITE wgetrc-tries-1"; sha256sum "$assets/agnhost" | cut -c1-64) | sha256sum | cut -c1-16)
if [ -f "$out/pause.tar" ] && [ -f "$out/agnhost.tar" ] && [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "build-test-images: $out is current" >&2
  echo "$out"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "build-test-images: needs root (debootstrap, chroot); run as root" >&2
  exit 1
fi
for t in debootstrap umoci skopeo gcc; do
  command -v "$t" >/dev/null || { echo "build-test-images: $t is missing; run scripts/setup.sh" >&2; exit 1; }
done
start=$(date +%s)
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

kmod=$(cd "$MOD" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' k8s.io/kubernetes)

# image FILE REPO TAG ROOTFS ENTRYPOINT [CMD]: one layer holding ROOTFS, written as
# the docker archive FILE.tar named REPO:TAG.
image() {
  local file=$1 repo=$2 tag=$3 rootfs=$4 entry=$5 layout=$work/oci-$1 cmd=()
  [ -n "${6:-}" ] && cmd=(--config.cmd "$6")
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci insert --image "$layout:$tag" "$rootfs" /
  umoci config --image "$layout:$tag" --no-history --architecture amd64 --os linux \
    --config.entrypoint "$entry" "${cmd[@]}" \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  umoci gc --layout "$layout"
  rm -f "$out/$file.tar"
  skopeo copy --quiet "oci:$layout:$tag" "docker-archive:$out/$file.tar:$repo:$tag"
}

echo "build-test-images: pause $PAUSE_TAG from $kmod/build/pause/linux/pause.c" >&2
mkdir -p "$work/pause-root"
gcc -Os -static -DVERSION="\"$PAUSE_TAG\"" -o "$work/pause-root/pause" "$kmod/build/pause/linux/pause.c"
strip "$work/pause-root/pause"
image pause registry.k8s.io/pause "$PAUSE_TAG" "$work/pause-root" /pause

echo "build-test-images: agnhost $AGNHOST_TAG on Debian $SUITE minbase (+$AGNHOST_PKGS)" >&2
rootfs=$work/agnhost-root
debootstrap --variant=minbase --include="$AGNHOST_PKGS" "$SUITE" "$rootfs" "$MIRROR" \
  >"$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/man/*
install -m 0755 "$assets/agnhost" "$rootfs/agnhost"
ln -sf agnhost "$rootfs/agnhost-2"
# agnhost's porter serves TLS with these; the e2e tests' uid/gid checks expect these names.
cp "$kmod/test/images/agnhost/porter/localhost.crt" "$kmod/test/images/agnhost/porter/localhost.key" "$rootfs/"
mkdir -p "$rootfs/uploads"
# Upstream's agnhost has busybox's wget, which tries once; Debian's retries 20 times,
# so an e2e check that a blocked address stays unreachable (`wget -T 5`) would take
# minutes instead of seconds. One try, as upstream's image behaves.
printf 'tries = 1\n' >"$rootfs/etc/wgetrc"
chroot "$rootfs" sh -c 'groupadd -g 50000 group-defined-in-image && useradd -u 1000 -G group-defined-in-image user-defined-in-image'
image agnhost registry.k8s.io/e2e-test-images/agnhost "$AGNHOST_TAG" "$rootfs" /agnhost pause

echo "$stamp" >"$out/.stamp"
echo "build-test-images: built in $(($(date +%s) - start)) s" >&2
echo "$out"
