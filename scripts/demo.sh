#!/usr/bin/env bash
# Set up .venv and run the main job: profile a scaled Wan2.1 model under several plans,
# add simulated full-size runs, and write offload-report.html.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/offload-lab demo "$@"
