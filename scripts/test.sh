#!/usr/bin/env bash
# The test command: make sure the set-up is done and the peers the tool
# tests talk to are installed (both skip what is already there), then run
# every test of the workspace, the real-model ones included.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/install-peers.sh
cargo test --workspace --all-targets
cargo test --workspace --doc
