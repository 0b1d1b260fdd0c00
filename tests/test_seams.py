"""The seams between offload-lab's modules: public names only, imports at the top (a few heavy
ones marked), no import cycle — checked by ``scripts/check_imports.py``, which CI also runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_imports.py"


def _check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / "scripts" / "check_imports.py")], capture_output=True,
                          text=True, timeout=120)


def test_the_package_has_no_private_import_deferred_import_or_cycle():
    r = _check(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 problem(s)" in r.stdout


def test_the_check_finds_each_kind_of_breach(tmp_path):
    # a copy of the package with one breach of each kind must fail, naming all three
    pkg = tmp_path / "offload_lab"
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "check_imports.py").write_text(SCRIPT.read_text())
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from offload_lab.b import _hidden\n")
    (pkg / "b.py").write_text("_hidden = 1\n\n\ndef f():\n    from offload_lab import a\n    return a\n")
    r = _check(tmp_path)
    assert r.returncode == 1
    assert "imports private '_hidden' from offload_lab.b" in r.stdout
    assert "function-level import of offload_lab.a" in r.stdout
    assert "import cycle: offload_lab.a ⇄ offload_lab.b" in r.stdout
