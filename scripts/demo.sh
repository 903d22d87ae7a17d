#!/usr/bin/env bash
# Sets up, builds, and runs the main job: `stoker demo`. Extra arguments go to it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh release >/dev/null
exec build/release/tools/cli/stoker demo "$@"
