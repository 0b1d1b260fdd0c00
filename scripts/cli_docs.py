#!/usr/bin/env python3
"""Rewrite the help blocks of ``docs/cli.md`` from the live ``offload-lab --help`` output.

    PYTHONPATH=. python3 scripts/cli_docs.py          # rewrite docs/cli.md
    PYTHONPATH=. python3 scripts/cli_docs.py --check  # exit 1 when the page is stale

Each ``## `offload-lab CMD` `` section's ```text block is replaced by ``offload-lab CMD --help``
at 100 columns; a subcommand without a section gets one, appended before "Regenerating".
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def help_text(*args: str) -> str:
    from offload_lab.cli.app import build_parser

    os.environ["COLUMNS"] = "100"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        build_parser().parse_args([*args, "--help"])
    return out.getvalue().rstrip("\n")


def commands() -> list[str]:
    from offload_lab.cli.app import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def render(page: str) -> str:
    block = re.compile(r"```text\n(usage: offload-lab(?: (\w+))? .*?)\n```", re.S)

    def replace(m: re.Match) -> str:
        cmd = m.group(2)
        return "```text\n" + help_text(*([cmd] if cmd else [])) + "\n```"

    page = block.sub(replace, page)
    for cmd in commands():
        if f"## `offload-lab {cmd}`" not in page:
            section = f"## `offload-lab {cmd}`\n\n```text\n{help_text(cmd)}\n```\n\n"
            page = page.replace("## Regenerating this page", section + "## Regenerating this page")
    return page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md is stale")
    args = ap.parse_args(argv)
    old = PAGE.read_text()
    new = render(old)
    if args.check:
        return int(new != old)
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
