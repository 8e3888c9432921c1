#!/usr/bin/env bash
# Build every Castad image on this machine with podman, needing no registry and no network
# inside a build:
#   1. a Debian bookworm root filesystem made with debootstrap, imported as an image (once;
#      REBUILD_ROOTFS=1 makes it again);
#   2. the base images derived from it (infra/images/bases.Containerfile);
#   3. per service, wheels of the service and of every dependency it has in uv.lock, built
#      here, then services/<service>/Dockerfile with those wheels as its context.
# Images are tagged localhost/castad/<service>:<version of its pyproject.toml>.
# Usage: infra/images/build.sh [service ...]   (all five when none is named). Run as root.
set -euo pipefail
cd "$(dirname "$0")/../.."

SERVICES=("$@")
WORK=var/images
ROOTFS_PACKAGES=python3,python3-venv,tini,ca-certificates,fonts-nanum,fonts-noto-cjk,libespeak-ng1
# Tagged by its package list, so a changed list makes a new root filesystem.
ROOTFS_IMAGE=localhost/castad/rootfs:bookworm-$(printf %s "$ROOTFS_PACKAGES" | sha256sum | cut -c1-12)
export CONTAINERS_CONF="$PWD/infra/images/containers.conf"

say() { printf '\033[1m[images]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[images] %s\033[0m\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "building images needs root (podman with runc and cgroupfs, and debootstrap)"
missing=()
for tool in podman debootstrap runc; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian's ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q podman debootstrap runc >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q podman debootstrap runc >/dev/null; } \
    || die "could not install podman, debootstrap and runc: apt-get install podman debootstrap runc"
fi
UV_VERSION=$(sed -n 's/^required-version = "==\(.*\)"$/\1/p' pyproject.toml)
UV=var/tools/uv-$UV_VERSION/bin/uv
PIP=var/tools/uv-$UV_VERSION/bin/pip
[ -x "$UV" ] || die "run make setup first (it installs uv $UV_VERSION into var/tools)"
# Every service, named where the topology names them (the contracts), when none is named on the command line.
[ ${#SERVICES[@]} -gt 0 ] \
  || read -ra SERVICES <<<"$(.venv/bin/python -c 'from castad_contracts import topology; print(*topology.SERVICES)')"

# 1. The root filesystem.
if [ "${REBUILD_ROOTFS:-0}" = 1 ] || ! podman image exists "$ROOTFS_IMAGE"; then
  say "making a Debian bookworm root filesystem with debootstrap (a few minutes)"
  rm -rf "$WORK/rootfs" && mkdir -p "$WORK"
  debootstrap --variant=minbase --include="$ROOTFS_PACKAGES" bookworm "$WORK/rootfs" ${DEBIAN_MIRROR:-} >"$WORK/debootstrap.log" 2>&1 \
    || die "debootstrap failed; see $WORK/debootstrap.log"
  rm -rf "$WORK"/rootfs/var/cache/apt/archives/*.deb "$WORK"/rootfs/var/lib/apt/lists/*
  tar -C "$WORK/rootfs" -c . | podman import --quiet --change 'CMD ["/bin/bash"]' - "$ROOTFS_IMAGE" >/dev/null
  rm -rf "$WORK/rootfs"
fi

# 2. The bases.
for target in build media voice python; do
  podman build --quiet --squash-all --target "$target" -t "localhost/castad/$target:bookworm" --build-arg "ROOTFS=$ROOTFS_IMAGE" \
    -f infra/images/bases.Containerfile infra/images >/dev/null
done
say "bases: localhost/castad/{build,media,voice,python}:bookworm"

# 3. The services.
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE=$(git remote get-url origin 2>/dev/null || true)
for service in "${SERVICES[@]}"; do
  package=castad-$service
  version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "services/$service/pyproject.toml")
  context=$WORK/context/$service
  rm -rf "$context" && mkdir -p "$context/wheels"
  "$UV" export --quiet --frozen --no-dev --no-editable --no-hashes --no-header --package "$package" \
    -o "$context/requirements.txt"
  # This machine's pip configuration (extra indexes, find-links) has no say: the lock does.
  PIP_CONFIG_FILE=/dev/null "$PIP" wheel --quiet --no-deps --disable-pip-version-check -r "$context/requirements.txt" -w "$context/wheels"
  podman build --quiet -f "services/$service/Dockerfile" \
    --build-arg VERSION="$version" --build-arg REVISION="$REVISION" --build-arg SOURCE="$SOURCE" \
    -t "localhost/castad/$service:$version" "$context" >/dev/null
  say "localhost/castad/$service:$version"
done
