#!/usr/bin/env bash
# Host tools for the kernel test matrix (`make kernels`, docs/kernels.md): qemu,
# a static busybox for the guests' userland, cpio, and the tools the tests call
# inside the guests (iproute2, iptables, ipvsadm). Idempotent; installs only what is missing.
#
# qemu comes from bookworm-backports on a bookworm host: bookworm's own qemu 7.2
# pulls in a qemu-utils older than the one some machine images ship. The backports
# source is added under its own name; backports are pinned at 100 by Debian, so
# nothing else on the host moves to them.
set -euo pipefail

BINS=(qemu-system-x86_64 cpio xz zstd ip iptables ipvsadm)
PKGS=(busybox-static cpio xz-utils zstd iproute2 iptables ipvsadm kmod)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
need_qemu=0
command -v qemu-system-x86_64 >/dev/null 2>&1 || need_qemu=1
[ ${#missing[@]} -eq 0 ] && [ $need_qemu -eq 0 ] && { echo "kernel-setup: ok"; exit 0; }

if [ "$(id -u)" -ne 0 ]; then
  [ $need_qemu -eq 1 ] && missing+=(qemu-system-x86)
  echo "kernel-setup: need root to apt-get install ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
. /etc/os-release
qemu_from=()
if [ $need_qemu -eq 1 ] && [ "${VERSION_CODENAME:-}" = bookworm ]; then
  list=/etc/apt/sources.list.d/ringlb-bookworm-backports.sources
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    # the archive address the host already uses (deb822 or one-line sources)
    uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [ -n "$uri" ] || uri=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    [ -n "$uri" ] || { echo "kernel-setup: no Debian archive address in /etc/apt" >&2; exit 1; }
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$uri" > "$list"
    echo "kernel-setup: added $list"
  fi
  qemu_from=(-t bookworm-backports)
fi
apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ $need_qemu -eq 1 ]; then
  apt-get install -y -qq --no-install-recommends "${qemu_from[@]}" qemu-system-x86
fi
for b in "${BINS[@]}"; do
  command -v "$b" >/dev/null 2>&1 || { echo "kernel-setup: $b still missing" >&2; exit 1; }
done
echo "kernel-setup: ok"
