#!/usr/bin/env bash
# The test command: make sure the set-up is done and the peers the tool
# tests talk to are installed (both skip what is already there), then run
# every test of the workspace, the real-model ones included. The default
# model's fp32 variant (`--fp32`, half a minute of conversion) is where the
# fast-forward test checks replies token for token.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --fp32
scripts/install-peers.sh
cargo test --workspace --all-targets
cargo test --workspace --doc
