#!/usr/bin/env bash
# A server the certifier refuses: harel-ref's Mongo reference certified on FerretDB v1.24.2.
#
#     bash benchmarks/ferretdb.sh                      # the standard profile, every property
#     bash benchmarks/ferretdb.sh --only contention    # any other arguments of `harel-ref certify`
#
# FerretDB 1.x speaks MongoDB's wire protocol over SQL (here its SQLite handler).  Its updates
# read the matching documents, then write each back by _id, in two steps: an update whose
# filter is a compare-and-set (what the Mongo reference builds on, docs/mongo.md) is not atomic
# there, and the certifier says so with a counterexample.  docs/mongo.md has what it found.
#
# What it does:
# 1. builds FerretDB from the Go module proxy (about 3 minutes the first time, then cached in
#    ~/.cache/harel-ref/ferretdb-v1.24.2): the module's copy lacks build/version/version.txt,
#    which FerretDB embeds, so the script builds from a copy with that file written;
# 2. starts it on a free loopback port with its SQLite handler in a temporary directory;
# 3. runs `harel-ref certify --bundled mongo` on it (HAREL_MONGO_URL), the report in
#    ./ferretdb-report unless --report-dir is given;
# 4. stops it and removes the directory, whatever happened.
# Not run in CI: it needs Go and the time of a certification.
set -euo pipefail

VERSION=v1.24.2
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/harel-ref/ferretdb-$VERSION"
BINARY="$CACHE/ferretdb"

if [ ! -x "$BINARY" ]; then
    command -v go >/dev/null || { echo "go not found: FerretDB is built from the Go module proxy" >&2; exit 2; }
    mkdir -p "$CACHE"
    build=$(mktemp -d)
    trap 'chmod -R u+w "$build"; rm -rf "$build"' EXIT
    echo "building FerretDB $VERSION (about 3 minutes the first time)" >&2
    module=$(cd "$build" && GOFLAGS=-mod=mod go mod download -json "github.com/FerretDB/FerretDB@$VERSION" \
             | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
    cp -r "$module" "$build/src"
    chmod -R u+w "$build/src"
    echo "$VERSION" > "$build/src/build/version/version.txt"
    (cd "$build/src" && go build -o "$BINARY.part" ./cmd/ferretdb)
    mv "$BINARY.part" "$BINARY"
    chmod -R u+w "$build"; rm -rf "$build"
    trap - EXIT
fi

data=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$BINARY" --handler=sqlite --sqlite-url="file:$data/" --listen-addr="127.0.0.1:$port" \
    --telemetry=disable --debug-addr=- --log-level=error >"$data/ferretdb.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    kill -0 "$server" 2>/dev/null || { cat "$data/ferretdb.log" >&2; exit 1; }
    sleep 0.1
done
echo "FerretDB $VERSION (SQLite handler) on 127.0.0.1:$port" >&2

report=(--report-dir ferretdb-report)
for argument in "$@"; do
    [ "$argument" = "--report-dir" ] && report=()
done
set +e
HAREL_MONGO_URL="mongodb://127.0.0.1:$port" harel-ref certify --bundled mongo "${report[@]}" "$@"
status=$?
set -e
exit "$status"
