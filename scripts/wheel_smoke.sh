#!/usr/bin/env bash
# The wheel is the product: build the wheel and sdist, install the wheel into a fresh virtual
# environment outside the checkout, and check it there (scripts/wheel_smoke.py): import, the
# command (catalog, demo --quick writing a report, simulate, export), %load_ext offload_lab in
# IPython, and every shipped data file found through the package.
#   bash scripts/wheel_smoke.sh [DIST_DIR]     (the built files stay in DIST_DIR when given)
# torch for that environment is pinned to the CPU build 2.13.0, which pip takes from local disk
# where it lies; an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$(pwd)
py=${PYTHON:-python3}
[ -x .venv/bin/python ] && py=.venv/bin/python
work=$(mktemp -d "${TMPDIR:-/tmp}/offload-lab-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
dist=${1:-$work/dist}
mkdir -p "$dist"

echo "wheel smoke: building wheel and sdist into $dist"
# the wheel is built from the sdist, so a file the sdist leaves out is missing from the wheel too
rm -f "$dist"/offload_lab-*.whl "$dist"/offload_lab-*.tar.gz
"$py" -m build --outdir "$dist" . >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
whl=$(ls "$dist"/offload_lab-*.whl)
sdist=$(ls "$dist"/offload_lab-*.tar.gz)
echo "wheel smoke: $(basename "$whl"), $(basename "$sdist")"

echo "wheel smoke: fresh environment in $work/venv"
# the system interpreter, not .venv's: nothing of the checkout's environment may leak in
base=$("$py" -c 'import sys; print(sys.base_prefix)')/bin/python3
"$base" -m venv "$work/venv"
# --no-compile: byte-compiling torch's thousands of modules at install time is most of the
# install's time; imports compile what they use
pip() { "$work/venv/bin/python" -m pip install -q --no-compile "$@" >>"$work/pip.log" 2>&1 \
          || { cat "$work/pip.log"; exit 1; }; }
pip torch==2.13.0
pip "$whl" "ipython>=8.12"

mkdir -p "$work/run"
cd "$work/run"
env -u PYTHONPATH "$work/venv/bin/python" "$checkout/scripts/wheel_smoke.py" "$checkout" "$work/run"
