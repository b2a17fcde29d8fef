#!/usr/bin/env bash
# Builds every shipped Leasehold binary. The one build command: deploy/Dockerfile runs it (with
# --release) and .ci/run runs it, so the image is built the way CI builds.
#
# The tests crate is left out: it turns on lease-service's `test-hooks` feature (the switch that
# breaks acquire for the invariant checker's tests), and cargo would unify that feature into the
# shipped lease-service were the tests crate in the build. `cargo test --workspace` builds the
# tests' binaries, and lease-service with the hooks, for itself.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo build --locked --workspace --exclude tests --bins "$@"
