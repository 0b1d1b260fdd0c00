"""Checks an installed offload-lab wheel from outside the checkout (run by scripts/wheel_smoke.sh).

    python wheel_smoke.py CHECKOUT WORKDIR

CHECKOUT is the source tree the wheel was built from: every file under its ``data/<kind>``
directories must be in the installed package, byte for byte (``offload_lab/_data/<kind>``),
and be found through the package (catalog, device profiles, shipped runs). WORKDIR is an empty
directory outside the checkout where the command writes its report. Exits non-zero, naming
what is wrong, at the first failed check.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

IGNORED = {".keep"}


def fail(text: str) -> None:
    sys.exit(f"wheel smoke: FAILED: {text}")


def check(ok: bool, text: str) -> None:
    if not ok:
        fail(text)


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def installed_package(checkout: Path) -> Path:
    import offload_lab

    pkg = Path(offload_lab.__file__).resolve().parent
    check(checkout not in pkg.parents, f"offload_lab imported from the checkout ({pkg}), not the wheel")
    check(Path(sys.prefix) in pkg.parents, f"offload_lab at {pkg} is not inside this environment {sys.prefix}")
    heavy = [m for m in ("plotly", "ipywidgets", "IPython") if m in sys.modules]
    check(not heavy, f"import offload_lab pulled in {heavy}")
    print(f"ok: import offload_lab {offload_lab.__version__} from {pkg}")
    return pkg


def data_files(checkout: Path, pkg: Path) -> None:
    """Every file of every ``data/<kind>`` of the checkout is in the wheel, unchanged."""
    kinds = sorted(d.name for d in (checkout / "data").iterdir() if d.is_dir())
    check(kinds != [], f"no data directories under {checkout / 'data'}")
    for kind in kinds:
        src, dst = checkout / "data" / kind, pkg / "_data" / kind
        files = sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file() and p.name not in IGNORED)
        missing = [str(f) for f in files if not (dst / f).is_file()]
        check(not missing, f"data/{kind} files missing from the wheel ({dst}): {missing}")
        changed = [str(f) for f in files if sha(src / f) != sha(dst / f)]
        check(not changed, f"data/{kind} files differ in the wheel: {changed}")
        print(f"ok: data/{kind}: {len(files)} files in the wheel")


def found_through_the_package(pkg: Path) -> None:
    import offload_lab
    from offload_lab.shipped import data_dir

    for kind in ("models", "devices"):
        d = data_dir(kind)
        check(d is not None and pkg in d.resolve().parents, f"shipped {kind} found at {d}, not in the wheel")
    names = offload_lab.catalog.names()
    check(len(names) >= 4, f"catalog names {names}")
    for name in names:
        spec = offload_lab.catalog.load(name)
        check(spec.total_bytes > 0, f"catalog model {name} has no bytes")
    devices = sorted(p.stem for p in data_dir("devices").glob("*.json"))
    for name in devices:
        offload_lab.DeviceProfile.load(name)
    print(f"ok: catalog {names}, device profiles {devices}")
    runs_dir = pkg / "_data" / "runs"
    zips = sorted(runs_dir.rglob("*.zip"))
    check(zips != [], f"no shipped runs under {runs_dir}")
    for p in zips:
        run = offload_lab.Run.load(p)
        check(len(run.events) > 0 and not run.simulated, f"shipped run {p.name} is empty or simulated")
    if hasattr(offload_lab, "shipped_runs"):
        runs = offload_lab.shipped_runs()
        check(len(runs) > 0, "offload_lab.shipped_runs() found no runs in the installed package")
        print(f"ok: offload_lab.shipped_runs(): {len(runs)} runs")
    print(f"ok: {len(zips)} shipped GPU runs load from the wheel")


def command(workdir: Path) -> None:
    exe = Path(sys.executable).parent / "offload-lab"
    check(exe.is_file(), f"no offload-lab console script in {exe.parent}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*args: str) -> str:
        r = subprocess.run([str(exe), *args], cwd=workdir, env=env, capture_output=True, text=True,
                           timeout=600)
        check(r.returncode == 0, f"offload-lab {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r.stdout

    out = run("catalog")
    check("wan2.1-t2v-14b" in out and "minimax-h3" in out, f"offload-lab catalog printed:\n{out}")
    check("h200" in run("catalog", "--devices"), "offload-lab catalog --devices lacks h200")
    run("demo", "--quick", "--out", "report.html")
    report = workdir / "report.html"
    text = report.read_text(encoding="utf-8") if report.is_file() else ""
    check(len(text) > 10_000 and "simulated" in text, f"demo --quick wrote no full report at {report}")
    run("simulate", "wan2.1-t2v-14b", "--device", "h200", "--tier", "pinned", "--steps", "1",
        "--out", "sim.zip")
    run("export", "sim.zip", "--format", "chrome-trace")
    check((workdir / "sim.trace.json").is_file(), "offload-lab export wrote no sim.trace.json")
    print(f"ok: offload-lab catalog, demo --quick ({report.stat().st_size} bytes of report), simulate, export")


def magic() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    import offload_lab

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "offload_lab")
    check("offload_profile" in shell.magics_manager.magics["line"], "%load_ext offload_lab registered no magic")
    shell.run_cell("from offload_lab import catalog, synthetic\n"
                   "model = synthetic.build(catalog.load('wan2.1-t2v-1.3b'), scale=0.05, layers=2)\n"
                   "inputs = synthetic.example_inputs(model, tokens=16)\n", store_history=False)
    runs = shell.run_line_magic("offload_profile", "-o -q -n 1 --warmup 0 --backend cpu model model(**inputs)")
    runs = runs if isinstance(runs, list) else [runs]
    check(all(isinstance(r, offload_lab.Run) and len(r.events) for r in runs), f"%offload_profile returned {runs!r}")
    print("ok: %load_ext offload_lab, %offload_profile in an IPython shell")


def main() -> None:
    checkout, workdir = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    check(Path.cwd().resolve() != checkout and checkout not in Path.cwd().resolve().parents,
          f"run me outside the checkout, not in {Path.cwd()}")
    sys.path = [p for p in sys.path if Path(p or ".").resolve() != checkout]
    pkg = installed_package(checkout)
    data_files(checkout, pkg)
    found_through_the_package(pkg)
    command(workdir)
    magic()
    print("wheel smoke: all checks passed")


if __name__ == "__main__":
    main()
