#!/usr/bin/env bash
# Builds the ringlb images here, with no registry and no container engine:
#   ghcr.io/ringlb/ringlb-controller:VERSION and ghcr.io/ringlb/ringlb-edge:VERSION
# (VERSION = the workspace version = the chart's appVersion).
#
#   1. cargo build of both programs, release profile unless --profile says otherwise
#      (debug info stripped from the copies);
#   2. a Debian minbase root filesystem from Debian's archive (debootstrap), cached;
#      the edge's also has nftables (the IPVS datapath's guard runs nft);
#   3. one OCI image layout per program (umoci): a base layer (the rootfs), a layer
#      with the binary and its licence notices (images/notices.py), and the
#      config that images/Dockerfile also sets (user, entrypoint, labels);
#   4. checks: skopeo reads each layout; each image is unpacked and its program runs
#      (`--help`, `--version`) inside its rootfs under chroot, the controller as
#      uid 65532, with ldd finding every shared library in the image;
#   5. a docker-archive per image for `docker load`, `ctr -n k8s.io images import`,
#      `kind load image-archive`.
#
# Usage: scripts/build-images.sh [--source] [--no-build] [--profile release|dev]
#   --source    also write ringlb-VERSION-source.tar.gz (tree + cargo vendor), the
#               Corresponding Source to publish beside the GPL-3.0 edge image
#   --no-build  reuse the binaries already in the target folder
#   --profile   the cargo profile of the binaries (default release, or
#               RINGLB_IMAGES_PROFILE). `dev` takes them from the workspace's test
#               build (`cargo test --no-run --workspace`): `make test` builds that
#               anyway, so its images cost no second full compile; release images
#               are what `make images` ships.
# Env: RINGLB_IMAGES_OUT (default images/out), RINGLB_IMAGES_CACHE (the base root
#      filesystems, kept between checkouts; default ~/.cache/ringlb/images),
#      IMAGE_REGISTRY (ghcr.io/ringlb),
#      DEBIAN_SUITE (bookworm), DEBIAN_MIRROR (http://deb.debian.org/debian),
#      CARGO, CARGO_TARGET_DIR. Needs root (debootstrap, chroot). docs/images.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SOURCE=0
BUILD=1
PROFILE=${RINGLB_IMAGES_PROFILE:-release}
while [ $# -gt 0 ]; do
  case "$1" in
    --source) SOURCE=1 ;;
    --no-build) BUILD=0 ;;
    --profile)
      [ $# -ge 2 ] || { echo "build-images: --profile needs release or dev" >&2; exit 2; }
      PROFILE=$2
      shift
      ;;
    *) echo "build-images: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
case "$PROFILE" in
  release) PROFILE_DIR=release ;;
  dev) PROFILE_DIR=debug ;;
  *) echo "build-images: --profile $PROFILE: only release or dev" >&2; exit 2 ;;
esac

CARGO=${CARGO:-cargo}
OUT=${RINGLB_IMAGES_OUT:-$ROOT/images/out}
REGISTRY=${IMAGE_REGISTRY:-ghcr.io/ringlb}
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
PROGRAMS=(ringlb-controller ringlb-edge)

T0=$(date +%s)
step() { echo "build-images: [$(($(date +%s) - T0))s] $*"; }
TIMES=()
timed() { # timed NAME CMD...: runs CMD, records its seconds
  local name=$1 s
  shift
  s=$(date +%s)
  "$@"
  TIMES+=("$name $(($(date +%s) - s))s")
}

if [ "$(id -u)" -ne 0 ]; then
  echo "build-images: needs root (debootstrap, chroot); run: sudo $0 $*" >&2
  exit 1
fi
missing=()
for t in debootstrap umoci skopeo; do
  command -v "$t" >/dev/null || missing+=("$t")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]} from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

VERSION=$("$CARGO" metadata --format-version 1 --offline --no-deps |
  python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="ringlb-edge"))')
APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/ringlb/Chart.yaml)
if [ "$VERSION" != "$APP_VERSION" ]; then
  echo "build-images: workspace version $VERSION != charts/ringlb/Chart.yaml appVersion $APP_VERSION" >&2
  exit 1
fi
mkdir -p "$OUT/cache"
# The base root filesystems depend only on the suite and the packages: kept outside
# the checkout, so a fresh clone (CI) does not debootstrap them again.
BASE_CACHE=${RINGLB_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ringlb/images}
mkdir -p "$BASE_CACHE"
CHROOT=$(command -v chroot)

build_binaries() {
  if [ "$BUILD" = 1 ]; then
    if [ "$PROFILE" = dev ]; then
      # The unit tests' own build: cargo builds both programs for their packages'
      # integration tests, with the features the whole workspace's test build
      # unifies, so `make test`'s later steps compile nothing again (a plain
      # `cargo build -p` resolves other features and rebuilds tokio, serde, ...).
      "$CARGO" test --no-run --workspace --locked
    else
      "$CARGO" build --release --locked -p ringlb-controller -p ringlb-edge
    fi
  fi
  mkdir -p "$OUT/bin"
  for p in "${PROGRAMS[@]}"; do
    strip --strip-debug -o "$OUT/bin/$p" "$TARGET_DIR/$PROFILE_DIR/$p"
  done
}

# The packages on top of minbase, per program: CA roots for both; nft for the
# edge (the IPVS datapath's guard, docs/ipvs.md), as images/Dockerfile installs.
packages_of() {
  case "$1" in
    ringlb-edge) echo ca-certificates,nftables ;;
    *) echo ca-certificates ;;
  esac
}

# The cached base root filesystem of a program.
rootfs_of() {
  case "$1" in
    ringlb-edge) echo "$BASE_CACHE/rootfs-$SUITE-edge" ;;
    *) echo "$BASE_CACHE/rootfs-$SUITE" ;;
  esac
}

# Debian minbase + the program's packages, trimmed like debian:*-slim (no docs but
# copyright files, no man pages, no apt lists or cached .debs). Cached by suite and
# program.
base_rootfs() {
  local p=$1 rootfs
  rootfs=$(rootfs_of "$p")
  if [ -f "$rootfs/.ringlb-base-ok" ]; then
    return
  fi
  rm -rf "$rootfs" "$rootfs.tmp"
  debootstrap --variant=minbase --include="$(packages_of "$p")" "$SUITE" "$rootfs.tmp" "$MIRROR" \
    >"$BASE_CACHE/debootstrap-$p.log" 2>&1 || {
    tail -n 20 "$BASE_CACHE/debootstrap-$p.log" >&2
    return 1
  }
  (
    cd "$rootfs.tmp"
    rm -rf var/cache/apt/archives/*.deb var/lib/apt/lists/* var/log/* tmp/*
    rm -rf usr/share/man/* usr/share/info/* usr/share/locale/*
    find usr/share/doc -mindepth 2 ! -name copyright ! -type d -delete
    find usr/share/doc -mindepth 1 -type d -empty -delete
  )
  touch "$rootfs.tmp/.ringlb-base-ok"
  mv "$rootfs.tmp" "$rootfs"
}

# The program's own layer: binary and licences, as images/Dockerfile copies them.
overlay() {
  local p=$1 dir=$OUT/overlay/$1
  rm -rf "$dir"
  mkdir -p "$dir/usr/local/bin" "$dir/usr/share/doc/ringlb"
  install -m 0755 "$OUT/bin/$p" "$dir/usr/local/bin/$p"
  cp LICENSE "$dir/usr/share/doc/ringlb/"
  if [ "$p" = ringlb-edge ]; then
    cp LICENSE-GPL-3.0 images/SOURCE.md "$dir/usr/share/doc/ringlb/"
  fi
  CARGO=$CARGO python3 images/notices.py "$p" "$dir/usr/share/doc/ringlb/third-party" >/dev/null
}

# The same config as the Dockerfile's stage for the program.
image_config() {
  local p=$1 licence user cmd=()
  case "$p" in
    ringlb-controller) licence=Apache-2.0 user=65532:65532 ;;
    ringlb-edge) licence=GPL-3.0-only user=0:0 cmd=(--config.cmd=--help) ;;
  esac
  umoci config --image "$OUT/oci/$p:$VERSION" --no-history \
    --architecture amd64 --os linux --author ringlb \
    --config.user "$user" \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.entrypoint "/usr/local/bin/$p" "${cmd[@]}" \
    --config.label "org.opencontainers.image.title=$p" \
    --config.label "org.opencontainers.image.version=$VERSION" \
    --config.label "org.opencontainers.image.licenses=$licence" \
    --manifest.annotation "org.opencontainers.image.version=$VERSION"
}

oci_image() {
  local p=$1 layout=$OUT/oci/$1
  rm -rf "$layout"
  umoci init --layout "$layout"
  umoci new --image "$layout:$VERSION"
  umoci insert --image "$layout:$VERSION" \
    --history.comment "Debian $SUITE minbase, $(packages_of "$p")" "$(rootfs_of "$p")" /
  overlay "$p"
  umoci insert --image "$layout:$VERSION" --history.comment "$p $VERSION" "$OUT/overlay/$p" /
  image_config "$p"
  umoci gc --layout "$layout"
  rm -f "$OUT/$p-$VERSION.tar"
  skopeo copy --quiet "oci:$layout:$VERSION" \
    "docker-archive:$OUT/$p-$VERSION.tar:$REGISTRY/$p:$VERSION"
}

run_in() { # run_in ROOTFS USER CMD...: prints and runs CMD inside ROOTFS
  local rootfs=$1 user=$2
  shift 2
  echo "  chroot --userspec=$user: $*"
  env -i PATH=/usr/local/bin:/usr/bin:/bin "$CHROOT" --userspec="$user" "$rootfs" "$@" \
    >"$OUT/verify/last.out" 2>&1 || {
    cat "$OUT/verify/last.out" >&2
    return 1
  }
  head -n 1 "$OUT/verify/last.out" | sed 's/^/    /'
}

verify() {
  local p=$1 layout=$OUT/oci/$1 bundle=$OUT/verify/$1 user
  skopeo inspect --config "oci:$layout:$VERSION" >"$OUT/verify/$p.config.json"
  python3 - "$OUT/verify/$p.config.json" "$p" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); p = sys.argv[2]
cfg = c["config"]
assert cfg["Entrypoint"] == [f"/usr/local/bin/{p}"], cfg
assert cfg["User"] == ("65532:65532" if p == "ringlb-controller" else "0:0"), cfg
print(f"  skopeo: {p}: user {cfg['User']}, entrypoint {cfg['Entrypoint']}, "
      f"licences {cfg['Labels']['org.opencontainers.image.licenses']}, "
      f"{len(c['rootfs']['diff_ids'])} layers")
PY
  rm -rf "$bundle"
  umoci unpack --image "$layout:$VERSION" "$bundle" >/dev/null
  user=0:0
  [ "$p" = ringlb-controller ] && user=65532:65532
  run_in "$bundle/rootfs" "$user" "/usr/local/bin/$p" --version
  run_in "$bundle/rootfs" "$user" "/usr/local/bin/$p" --help
  if [ "$p" = ringlb-edge ]; then
    for sub in run node speaker datapath; do
      run_in "$bundle/rootfs" "$user" /usr/local/bin/ringlb-edge "$sub" --help
    done
    run_in "$bundle/rootfs" "$user" /usr/sbin/nft --version
  fi
  run_in "$bundle/rootfs" 0:0 ldd "/usr/local/bin/$p"
  if grep -q "not found" "$OUT/verify/last.out"; then
    echo "build-images: $p: a shared library is missing in the image" >&2
    cat "$OUT/verify/last.out" >&2
    return 1
  fi
  rm -rf "$bundle"
}

source_tarball() {
  local name=ringlb-$VERSION dir=$OUT/cache/source
  rm -rf "$dir"
  mkdir -p "$dir/$name"
  git archive --format=tar HEAD | tar -x -C "$dir/$name"
  # cargo vendor prints the source replacement that builds from vendor/.
  mkdir -p "$dir/$name/.cargo"
  (cd "$dir/$name" && "$CARGO" vendor --locked --offline vendor >>.cargo/config.toml)
  tar -C "$dir" -czf "$OUT/$name-source.tar.gz" "$name"
  rm -rf "$dir"
}

step "version $VERSION; out $OUT"
timed "cargo build --profile $PROFILE" build_binaries
for p in "${PROGRAMS[@]}"; do
  step "base rootfs of $p (Debian $SUITE, $(packages_of "$p"))"
  timed "base rootfs $p" base_rootfs "$p"
done
mkdir -p "$OUT/oci" "$OUT/verify"
for p in "${PROGRAMS[@]}"; do
  step "image $REGISTRY/$p:$VERSION"
  timed "image $p" oci_image "$p"
done
for p in "${PROGRAMS[@]}"; do
  step "verify $p"
  timed "verify $p" verify "$p"
done
if [ "$SOURCE" = 1 ]; then
  step "source tarball"
  timed "source tarball" source_tarball
fi
TIMES+=("total $(($(date +%s) - T0))s")
printf '%s\n' "${TIMES[@]}" | tee "$OUT/build-times.txt"
step "done:"
for p in "${PROGRAMS[@]}"; do
  echo "  $REGISTRY/$p:$VERSION  oci:$OUT/oci/$p:$VERSION  $OUT/$p-$VERSION.tar ($(du -h "$OUT/$p-$VERSION.tar" | cut -f1))"
done
