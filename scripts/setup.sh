#!/usr/bin/env bash
# Sets up .venv for offload-lab on a fresh machine (idempotent).
#   bash scripts/setup.sh          the package with its notebook extra (widgets, the magic, JupyterLab)
#   bash scripts/setup.sh --dev    plus test and docs tools (pytest, ruff, nbclient, playwright,
#                                  mkdocs, build; Debian chromium), every one at the exact version
#                                  in constraints/dev.txt so test runs do not depend on the day
# torch: an importable torch is kept as it is (the venv sees system packages); otherwise the
# CPU build 2.13.0 is installed, which pip takes from local disk where it lies, instead of
# letting an unpinned dependency pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0
[ "${1:-}" = "--dev" ] && dev=1
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$py" -m venv --system-site-packages .venv
fi
pip=".venv/bin/python -m pip"
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing torch==2.13.0 (CPU build)"
  $pip install -q torch==2.13.0
fi
if [ "$dev" = 1 ]; then
  $pip install -q -c constraints/dev.txt -e ".[dev]"
  if ! command -v chromium >/dev/null 2>&1; then
    echo "setup: installing Debian chromium for the report browser tests"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "setup: chromium could not be installed; browser tests will fail" >&2
  fi
else
  # a checkout is for the notebooks too; `pip install offload-lab` alone stays without them
  $pip install -q -e ".[notebook]"
fi
