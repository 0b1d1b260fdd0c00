"""Writing output files: the one rule every save and every command follows.

* The target is a regular file or does not exist yet. A directory, FIFO, socket or device node
  is never written to nor replaced, ``--force`` or not: replacing ``/dev/null`` with a report,
  or blocking forever on a FIFO nobody reads, is never what was meant.
* A writer that appends a suffix (``Run.save`` adds ``.zip``) is checked at the path as given
  *and* at the path it will write, so a refused target leaves no ``*.zip`` beside it.
* The file is written whole to a temporary file in the target's directory and renamed over the
  target (:func:`os.replace`): a failed write leaves the target as it was and no temporary file.
* A symbolic link is followed: the file it points to is replaced and the link stays a link.

Only :mod:`os.stat` looks at a target before it is written; nothing here ``open()``s it (opening
a FIFO blocks until a reader comes).

>>> import os, tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> atomic_write(d / "notes.txt", "hello").read_text()
'hello'
>>> os.mkfifo(d / "pipe")
>>> atomic_write(d / "pipe", "hello")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
offload_lab.writing.OutputError: output '.../pipe' is a FIFO (named pipe), not a regular file; ...
>>> sorted(p.name for p in d.iterdir())
['notes.txt', 'pipe']
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from offload_lab.errors import OffloadLabError

__all__ = ["OutputError", "REGULAR", "kind_of", "check_target", "check_writable_dir", "atomic_write"]

#: what :func:`kind_of` calls a regular file
REGULAR = "regular file"

_KINDS = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO (named pipe)"),
          (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
          (stat.S_ISSOCK, "socket"))


class OutputError(OffloadLabError, ValueError):
    """A path offload-lab will not write to; the message names it, what it is and what to do."""


def kind_of(path: str | os.PathLike) -> str | None:
    """What is at ``path``, links followed: ``None`` when nothing is, else ``'regular file'``,
    ``'directory'``, ``'FIFO (named pipe)'``, ``'character device'``, ``'block device'``,
    ``'socket'`` or ``'symbolic link loop'``.

    >>> kind_of("/dev/null"), kind_of("/no/such/file"), kind_of("/")
    ('character device', None, 'directory')
    """
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None  # a missing parent fails the write itself, with its own message
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link that points back at itself
            return "symbolic link loop"
        return None  # unreadable, name too long, ...: the write fails and says so
    if stat.S_ISREG(mode):
        return REGULAR
    return next((name for test, name in _KINDS if test(mode)), "special file")


def _with_suffix(path: Path, suffix: str | None) -> Path:
    # the writers that add a suffix add it to a name that lacks it, never replace another one
    return path if not suffix or path.suffix == suffix else path.with_name(path.name + suffix)


def _refuse(kind: str, shown: str, written: Path | None, what: str, example: str) -> OutputError:
    where = f"{what} {shown!r}" + (f" (written as {str(written)!r})" if written is not None else "")
    if kind == "directory":
        inside = Path(shown) / example if written is None else written / example
        return OutputError(f"{where} is a directory; expected a file path such as {str(inside)!r}")
    return OutputError(f"{where} is a {kind}, not a regular file; only a regular file or a new path "
                       f"is ever written or replaced; choose a file path such as {example!r}")


def check_target(path: str | os.PathLike, suffix: str | None = None, what: str = "output",
                 example: str | None = None) -> Path:
    """The path a save of ``path`` writes (``suffix`` appended when missing), after refusing a
    target that is not a regular file, at the path as given and at the path written.

    ``what`` names the path in the message (``--out`` on the command line); ``example`` is the
    file name suggested instead (default ``out`` + ``suffix``).

    >>> check_target("/tmp/new-run", suffix=".zip").name
    'new-run.zip'
    >>> check_target("/dev/null", suffix=".zip", what="--out")
    Traceback (most recent call last):
    ...
    offload_lab.writing.OutputError: --out '/dev/null' is a character device, not a regular file; only a regular file or a new path is ever written or replaced; choose a file path such as 'out.zip'
    """
    example = example or f"out{suffix or ''}"
    given = Path(path)
    final = _with_suffix(given, suffix)
    for candidate in dict.fromkeys((given, final)):
        kind = kind_of(candidate)
        if kind is not None and kind != REGULAR:
            raise _refuse(kind, str(path), candidate if candidate != given else None, what, example)
    return final


def check_writable_dir(path: str | os.PathLike, shown: str | None = None) -> Path:
    """The directory ``path`` goes in, created when missing and checked writable by making (and
    removing) a temporary file in it; an :class:`OutputError` names ``shown`` (default
    ``path``) and says why not.

    >>> check_writable_dir("/proc/version")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    offload_lab.writing.OutputError: cannot write '/proc/version': '/proc' is not a writable directory (...)
    """
    parent = Path(os.path.realpath(path)).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)  # saving would create it anyway
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise OutputError(f"cannot write {shown or str(path)!r}: {str(parent)!r} is not a writable directory "
                          f"({e.strerror or e})") from None
    return parent


def _real(path: Path) -> Path:
    # replace the file a link points to, not the link (``/dev/stdout`` redirected to a file
    # stays a link to that file)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def atomic_write(path: str | os.PathLike, content: bytes | str | Callable[[Path], object],
                 suffix: str | None = None, what: str = "output", example: str | None = None,
                 encoding: str = "utf-8") -> Path:
    """Write ``content`` to ``path`` by the rule above and return the path written.

    ``content`` is the bytes or text of the file, or a function that writes the file at the
    temporary path it is given (for writers such as :class:`zipfile.ZipFile` that want a path).
    ``suffix``, ``what`` and ``example`` are as for :func:`check_target`. Missing parent
    directories are created. An existing target keeps its permission bits.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> atomic_write(d / "run", lambda tmp: tmp.write_bytes(b"PK"), suffix=".zip").name
    'run.zip'
    >>> atomic_write(d / "run.zip", b"again").read_bytes(), sorted(p.name for p in d.iterdir())
    (b'again', ['run.zip'])
    """
    final = check_target(path, suffix, what, example)
    real = _real(final)
    real.parent.mkdir(parents=True, exist_ok=True)
    # a fresh name beside the target: two saves at once never share a temporary file, and the
    # file is created with the umask's permissions like any other new file
    tmp = real.with_name(f"{real.name[:200]}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        if callable(content):
            os.close(fd)
            fd = -1
            content(tmp)
        else:
            data = content.encode(encoding) if isinstance(content, str) else bytes(content)
            with os.fdopen(fd, "wb") as f:
                fd = -1
                f.write(data)
        # look again just before the rename: the target may have changed while the data was
        # written (a FIFO made in its place is still never replaced)
        kind = kind_of(real)
        if kind == REGULAR:
            os.chmod(tmp, stat.S_IMODE(os.stat(real).st_mode))
        elif kind is not None:
            raise _refuse(kind, str(path), real if real != Path(path) else None, what,
                          example or f"out{suffix or ''}")
        os.replace(tmp, real)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return final
