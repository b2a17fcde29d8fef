#!/usr/bin/env bash
# Builds every Leasehold binary. The one build command: deploy/Dockerfile runs it (with
# --release) and .ci/run runs it, so the image is built the way CI builds.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo build --locked --workspace --bins "$@"
