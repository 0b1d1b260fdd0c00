"""Where the ``offload-lab`` commands write, and the one rule they follow.

* An output that already exists is refused unless ``--force`` is given.
* An output is never one of the command's inputs, ``--force`` or not.
* A directory is never an output file.
* The directory an output goes in must be writable, checked before any work is done.
* A save that fails leaves nothing behind (no half-written file, no ``*.tmp``).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> check_output(d, suffix=".zip")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
offload_lab.cli.outputs.OutputError: --out '...' is a directory; expected a file path such as '.../run.zip'
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from offload_lab.errors import OffloadLabError

__all__ = ["OutputError", "FORCE_HELP", "check_output", "check_output_dir", "cleaned_up"]

FORCE_HELP = ("overwrite output files that already exist (an output is never written over one of "
              "the command's inputs)")


class OutputError(OffloadLabError, ValueError):
    """An output path the command will not write to; the message says why and what to do."""


def _final(path: str | os.PathLike, suffix: str | None) -> Path:
    p = Path(path)
    # Run.save appends .zip to a path that lacks it; check the file it will really write
    if suffix and p.suffix != suffix:
        p = p.with_name(p.name + suffix)
    return p


def _writable_dir(out: Path, shown: str) -> None:
    parent = out.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)  # saving would create it anyway
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise OutputError(f"cannot write {shown!r}: {str(parent)!r} is not a writable directory "
                          f"({e.strerror or e})") from None


def check_output(path: str | os.PathLike, force: bool = False, inputs: Iterable[str | os.PathLike] = (),
                 suffix: str | None = None, what: str = "--out") -> Path:
    """The file ``path`` will be written as (``suffix`` appended when missing), checked by the
    rule above before any work is done.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "run.zip").write_text("x")
    1
    >>> check_output(d / "new.zip").name, check_output(d / "run", force=True, suffix=".zip").name
    ('new.zip', 'run.zip')
    """
    shown = str(path)
    if not shown.strip():
        raise OutputError(f"{what} '' is empty; expected a file path")
    out = _final(path, suffix)
    for candidate in (Path(path), out):
        if candidate.is_dir():
            example = Path(path) / ("run.zip" if suffix == ".zip" else "offload-report.html")
            raise OutputError(f"{what} {shown!r} is a directory; expected a file path such as "
                              f"{str(example)!r}")
    resolved = out.resolve()
    for item in inputs:
        if Path(item).resolve() == resolved:
            raise OutputError(f"{what} {shown!r} is also an input of this command; write the "
                              f"output to another file")
    if out.exists() and not force:
        raise OutputError(f"{what} {shown!r} already exists; pass --force to overwrite it, or "
                          f"choose another path")
    _writable_dir(out, shown)
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
    if d.exists() and not d.is_dir():
        raise OutputError(f"{what} {shown!r} is a file, not a directory; give a directory to save "
                          f"the runs in")
    if d.is_dir() and not force and any(d.glob(pattern)):
        raise OutputError(f"{what} {shown!r} already holds {pattern} files; pass --force to "
                          f"overwrite them, or choose another directory")
    _writable_dir(d / "probe", shown)
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
        if not existed:
            path.unlink(missing_ok=True)
        raise
