"""Print constraints/dev.txt: the exact version of everything ``offload-lab[dev]`` pulls in, as
installed in the running environment (its dependency closure, read from the installed metadata).

    .venv/bin/python scripts/pin_dev.py > constraints/dev.txt

torch and the packages only torch needs are left out (setup.sh installs torch first, CPU or
CUDA build as the machine wants), and so are pip, setuptools and offload-lab itself.
"""

from __future__ import annotations

import re
from importlib import metadata

from packaging.requirements import Requirement

HEADER = """\
# Exact versions for the test environment: `bash scripts/setup.sh --dev` installs with
#   pip install -c constraints/dev.txt -e ".[dev]"
# so a test run today and one next month use the same diffusers, transformers, pytest...
# Users' installs (pyproject.toml, setup.sh without --dev) keep their ranges.
# Not pinned here: torch and what only torch needs (setup.sh installs torch first), pip,
# setuptools and offload-lab itself.
# Written by scripts/pin_dev.py. Refresh: bash scripts/check_latest.sh runs the suite on the
# newest versions in a throwaway venv and writes its pins to a file; when it passes, copy that
# file here and commit it with any fixes the new versions needed."""
SKIP = {"offload-lab", "torch", "triton", "sympy", "mpmath", "networkx", "pip", "setuptools", "wheel"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str = "offload-lab", extras: frozenset[str] = frozenset({"dev"})) -> dict:
    """Installed distributions ``root[extras]`` needs, directly or not: name -> distribution."""
    dists: dict[str, metadata.Distribution] = {}
    for d in metadata.distributions():  # the first on sys.path is the one imported
        dists.setdefault(_norm(d.metadata["Name"]), d)
    done: dict[str, set[str]] = {}
    todo = [(root, set(extras))]
    while todo:
        name, wanted = todo.pop()
        key = _norm(name)
        if key not in dists or (key in done and wanted <= done[key]):
            continue
        done.setdefault(key, set()).update(wanted)
        for text in dists[key].requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted | {""}):
                todo.append((req.name, set(req.extras)))
    return {k: dists[k] for k in done}


def main() -> None:
    print(HEADER)
    found = closure()
    for key in sorted(found):
        if key in SKIP or key.startswith("nvidia-"):
            continue
        print(f"{found[key].metadata['Name']}=={found[key].version}")


if __name__ == "__main__":
    main()
