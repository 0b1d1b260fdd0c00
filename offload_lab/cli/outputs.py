"""Where the ``offload-lab`` commands write, and the one rule they follow.

* An output is a regular file or a new path: a directory, FIFO, socket or device node is
  refused, ``--force`` or not (the core of the rule is :mod:`offload_lab.writing`, which every
  ``save`` follows too).
* An output that already exists is refused unless ``--force`` is given.
* An output is never one of the command's inputs, ``--force`` or not.
* The directory an output goes in must be writable.
* Outputs are checked after the inputs (a corrupt input is reported as such) and before the work.
* A save that fails leaves nothing behind (no half-written file, no ``*.tmp``).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> check_output(d, suffix=".zip")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
offload_lab.writing.OutputError: --out '...' is a directory; expected a file path such as '.../run.zip'
>>> check_output("/dev/null", force=True)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
offload_lab.writing.OutputError: --out '/dev/null' is a character device, not a regular file; ...
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from offload_lab.writing import REGULAR, OutputError, check_target, check_writable_dir, kind_of

__all__ = ["OutputError", "FORCE_HELP", "check_output", "check_output_dir", "cleaned_up"]

FORCE_HELP = ("overwrite output files that already exist (an output is never written over one of "
              "the command's inputs, nor over a device, FIFO, socket or directory)")


def check_output(path: str | os.PathLike, force: bool = False, inputs: Iterable[str | os.PathLike] = (),
                 suffix: str | None = None, what: str = "--out", example: str | None = None) -> Path:
    """The file ``path`` will be written as (``suffix`` appended when missing), checked by the
    rule above before any work is done; ``example`` is the file name a refusal suggests.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "run.zip").write_text("x")
    1
    >>> check_output(d / "new.zip").name, check_output(d / "run", force=True, suffix=".zip").name
    ('new.zip', 'run.zip')
    """
    shown = str(path)
    if not shown.strip():
        raise OutputError(f"{what} '' is empty; expected a file path")
    example = example or ("run.zip" if suffix == ".zip" else "offload-report.html")
    out = check_target(path, suffix, what, example)
    resolved = out.resolve()
    for item in inputs:
        if Path(item).resolve() == resolved:
            raise OutputError(f"{what} {shown!r} is also an input of this command; write the "
                              f"output to another file")
    if kind_of(out) is not None and not force:
        raise OutputError(f"{what} {shown!r} already exists; pass --force to overwrite it, or "
                          f"choose another path")
    check_writable_dir(out, shown)
    return out


def check_output_dir(path: str | os.PathLike, force: bool = False, what: str = "--save-runs",
                     pattern: str = "*.zip") -> Path:
    """A directory to write files into: not an existing file, writable, and without files
    matching ``pattern`` unless ``force`` (they would be overwritten).

    >>> import tempfile, pathlib
    >>> check_output_dir(pathlib.Path(tempfile.mkdtemp()) / "runs").name
    'runs'
    """
    shown = str(path)
    if not shown.strip():
        raise OutputError(f"{what} '' is empty; expected a directory")
    d = Path(path)
    kind = kind_of(d)
    if kind is not None and kind != "directory":
        what_it_is = "a file" if kind == "regular file" else f"a {kind}"
        raise OutputError(f"{what} {shown!r} is {what_it_is}, not a directory; give a directory to "
                          f"save the runs in")
    if kind == "directory" and not force and any(d.glob(pattern)):
        raise OutputError(f"{what} {shown!r} already holds {pattern} files; pass --force to "
                          f"overwrite them, or choose another directory")
    check_writable_dir(d / "probe", shown)
    return d


@contextlib.contextmanager
def cleaned_up(path: Path) -> Iterator[None]:
    """Remove ``path`` and ``path.tmp`` when the block fails, unless ``path`` existed before
    (a failed save must not leave a half-written file).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "r.html"
    >>> try:
    ...     with cleaned_up(p):
    ...         _ = p.with_name("r.html.tmp").write_text("half"); raise OSError("disk full")
    ... except OSError:
    ...     pass
    >>> sorted(x.name for x in p.parent.iterdir())
    []
    """
    existed = path.exists()
    try:
        yield
    except BaseException:
        path.with_name(path.name + ".tmp").unlink(missing_ok=True)
        if not existed and kind_of(path) == REGULAR:
            path.unlink(missing_ok=True)
        raise
