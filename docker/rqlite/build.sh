#!/usr/bin/env bash
# Build the local rqlite image (default tag harel-ref/rqlite:8.43.4) without any
# container registry:
#   1. compile a static rqlited v8.43.4 on the host with Go, from the wrapper
#      module in this folder (go.mod/go.sum pin every dependency);
#   2. `docker build` a FROM-scratch image holding that binary and a static
#      busybox (for the compose health check).
# Each step is skipped when its result already exists; FORCE=1 redoes both.
#
# Usage: bash docker/rqlite/build.sh [binary|image]   (default: image, which
#        implies binary). Environment: RQLITE_IMAGE (tag), DOCKER (client),
#        FORCE=1.
set -euo pipefail

RQLITE_VERSION=v8.43.4
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="$HERE/build"
ROOTFS="$BUILD/rootfs"
BIN="$ROOTFS/bin/rqlited"
TAG="${RQLITE_IMAGE:-harel-ref/rqlite:8.43.4}"
DOCKER="${DOCKER:-docker}"
FORCE="${FORCE:-0}"

log() { printf '[rqlite-build] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

build_binary() {
    # One build at a time: a second caller (.ci/setup starts the build early, then .ci/cluster
    # asks for the image) waits for the first, then finds the binary made.
    mkdir -p "$BUILD"
    exec 9>"$BUILD/.binary.lock"
    flock 9
    if [[ "$FORCE" != 1 && -x "$BIN" ]] && "$BIN" -version 2>&1 | grep -q "rqlited $RQLITE_VERSION "; then
        log "binary present: $BIN ($("$BIN" -version 2>&1 | head -1)); skipping go build"
        return 0
    fi
    # The machine image installs Go under /usr/local/go; a bare environment may lack it on PATH.
    command -v go >/dev/null || { [[ -x /usr/local/go/bin/go ]] && export PATH="/usr/local/go/bin:$PATH"; } || true
    command -v go >/dev/null || die "go is not installed (need Go >= 1.24 to build rqlited)"
    command -v gcc >/dev/null || die "gcc is not installed (rqlite's sqlite driver needs cgo)"
    [[ -e /usr/lib/x86_64-linux-gnu/libc.a || -e /usr/lib/libc.a ]] || \
        log "warning: no static libc.a found (Debian: libc6-dev); static link may fail"
    log "compiling rqlited $RQLITE_VERSION (static, cgo) with $(go version | awk '{print $3}')..."
    local t0=$SECONDS
    mkdir -p "$ROOTFS/bin"
    local pkg=github.com/rqlite/rqlite/v8/cmd
    # Same linker variables as rqlite's own release build; static like its musl
    # build: netgo/osusergo keep glibc's NSS out, -extldflags -static links libc in.
    # sqlite_omit_load_extension drops SQLite extension loading (dlopen cannot
    # work in a static binary anyway, and this image ships no extensions).
    (
        cd "$HERE"
        CGO_ENABLED=1 GOFLAGS=-mod=readonly go build -trimpath -buildvcs=false \
            -tags "netgo osusergo sqlite_omit_load_extension" \
            -ldflags "-w -s -linkmode external -extldflags -static \
                -X $pkg.Version=$RQLITE_VERSION -X $pkg.Branch=release \
                -X $pkg.Commit=module-proxy -X $pkg.CompilerCommand=gcc" \
            -o "$BIN.tmp" github.com/rqlite/rqlite/v8/cmd/rqlited
    )
    mv "$BIN.tmp" "$BIN"
    "$BIN" -version 2>&1 | grep -q "rqlited $RQLITE_VERSION " || die "built binary reports the wrong version"
    log "go build done in $((SECONDS - t0))s: $("$BIN" -version 2>&1 | head -1)"
}

build_image() {
    if [[ "$FORCE" != 1 ]] && "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
        log "image $TAG exists; skipping build"
        return 0
    fi
    build_binary
    local bb
    bb="$(command -v busybox || true)"
    [[ -n "$bb" ]] || die "busybox not found (apt-get install busybox-static)"
    if ! file -L "$bb" 2>/dev/null | grep -q 'statically linked'; then
        # `file` may be missing; fall back to ldd's verdict
        if ldd "$bb" >/dev/null 2>&1; then die "$bb is not static (apt-get install busybox-static)"; fi
    fi
    install -m 0755 "$bb" "$ROOTFS/bin/busybox"
    mkdir -p "$ROOTFS/tmp" "$ROOTFS/rqlite/file"
    chmod 1777 "$ROOTFS/tmp"
    log "docker build -t $TAG ..."
    local t0=$SECONDS
    local out
    if ! out="$("$DOCKER" build -q -t "$TAG" -f "$HERE/Dockerfile" "$BUILD" 2>&1)"; then
        printf '%s\n' "$out" >&2
        die "docker build failed"
    fi
    log "docker build done in $((SECONDS - t0))s"
}

case "${1:-image}" in
    binary) build_binary ;;
    image) build_image ;;
    *) die "usage: $0 [binary|image]" ;;
esac
