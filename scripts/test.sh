#!/usr/bin/env bash
# Set up .venv with the test tools (and Debian chromium) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
exec .venv/bin/python -m pytest "$@"
