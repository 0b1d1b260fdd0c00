#!/usr/bin/env bash
# The test suite on the newest versions of every test dependency, in a throwaway venv: how to
# refresh constraints/dev.txt. Never run by CI (it downloads whatever is newest today).
#   bash scripts/check_latest.sh [pytest args]    e.g. -x -q tests/test_pipeline_whole.py
# The venv sees the system's packages, so it reuses the importable torch (kept at its version:
# a newer torch is a separate decision); everything else is upgraded to the newest release.
# It writes the pins it ran with to $PINS (default dev-latest.txt in the venv's directory);
# when the tests pass, copy that file over constraints/dev.txt and commit it.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
tmp=$(mktemp -d)
venv="$tmp/venv"
pins=${PINS:-$tmp/dev-latest.txt}
echo "check_latest: throwaway venv $venv"
"$py" -m venv --system-site-packages "$venv"
torch=$("$venv/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null || echo "")
if [ -n "$torch" ]; then
  echo "torch==$torch" > "$tmp/torch.txt"
else
  echo "torch==2.13.0" > "$tmp/torch.txt"
fi
"$venv/bin/python" -m pip install -q --upgrade --upgrade-strategy eager -c "$tmp/torch.txt" -e ".[dev]"
"$venv/bin/python" scripts/pin_dev.py > "$pins"
echo "check_latest: pins written to $pins"
status=0
"$venv/bin/python" -m pytest "$@" || status=$?
echo "check_latest: pytest exit status $status; pins in $pins (venv left in $tmp; remove it when done)"
exit "$status"
