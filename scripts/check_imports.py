"""Checks the seams between offload-lab's modules (run by the tests and CI).

* no module imports a private (``_name``) name from another offload_lab module;
* internal imports sit at module top, except those marked ``# heavy: <why>`` because the imported
  module pulls in torch, plotly, ipywidgets or diffusers (at most MAX_DEFERRED of them);
* no import cycle among offload_lab modules, function-level imports included.

    python scripts/check_imports.py          # exit 1 and one line per finding
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "offload_lab"
MAX_DEFERRED = 25
HEAVY = ("torch", "plotly", "ipywidgets", "diffusers", "IPython", "transformers", "accelerate")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def main() -> int:
    files = sorted(PKG.rglob("*.py"))
    modules = {module_name(f): f for f in files}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    problems: list[str] = []
    deferred = 0
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        top = {id(n) for n in tree.body}
        # imports under `if TYPE_CHECKING:` / try at top are still top level
        for n in tree.body:
            if isinstance(n, (ast.If, ast.Try)):
                top |= {id(c) for c in ast.walk(n)}
        for node in ast.walk(tree):
            targets: list[tuple[str, str | None]] = []
            if isinstance(node, ast.ImportFrom):
                base = resolve(mod, is_pkg, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append((sub if sub in modules else base, alias.name))
            elif isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            else:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            for target, name in targets:
                if target.split(".")[0] != "offload_lab" or target not in modules:
                    continue
                if target != mod:
                    edges[mod].add(target)
                if name and name.startswith("_") and not name.startswith("__") \
                        and f"{target.rsplit('.', 1)[0] if False else target}" != mod:
                    if f"{target}.{name}" not in modules:
                        problems.append(f"{where}: imports private {name!r} from {target}")
                if id(node) not in top:
                    marked = "# heavy:" in lines[node.lineno - 1]
                    if not marked:
                        problems.append(f"{where}: function-level import of {target} "
                                        f"(move it to the top, or mark '# heavy: <why>')")
                    else:
                        deferred += 1
    if deferred > MAX_DEFERRED:
        problems.append(f"{deferred} function-level imports marked heavy; at most {MAX_DEFERRED}")
    # cycles: Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    for comp in sccs:
        problems.append("import cycle: " + " ⇄ ".join(comp))
    for p in problems:
        print(p)
    print(f"check_imports: {len(modules)} modules, {sum(map(len, edges.values()))} internal "
          f"import edges, {deferred} marked heavy, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
