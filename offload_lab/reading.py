"""Every file offload-lab reads is checked here before a byte of it is read.

A path given by a user may name anything: a FIFO (opening it for reading waits for a writer
forever), a character device (``/dev/zero`` never ends), a directory, or a regular file of
many GiB. :func:`check_input` refuses all of these by ``os.stat`` alone, never opening the
path; :func:`read_bytes`, :func:`read_text` and :func:`read_json` then read at most the cap
of the kind of file (opened without blocking, checked again on the open descriptor, so that a
path swapped for a FIFO in between is still refused). JSON is also refused when it nests too
deeply for Python's parser (a ``RecursionError`` otherwise). Each refusal is one
:class:`InputFileError` line naming the path, what it is and what is accepted.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "plan.json"
>>> _ = p.write_text('{"format": "offload-lab/plan"}')
>>> read_json(p, "plan", MAX_JSON_BYTES)
{'format': 'offload-lab/plan'}
>>> read_json("/dev/null", "plan", MAX_JSON_BYTES)
Traceback (most recent call last):
...
offload_lab.reading.InputFileError: plan '/dev/null' is a character device, not a regular file; accepted: a regular file of at most 64 MiB

This module is the low level of the package: it imports only the standard library and
:mod:`offload_lab.errors`.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from offload_lab.errors import OffloadLabError

__all__ = ["json_document", "InputFileError", "MissingInputError", "check_input", "open_binary", "read_bytes", "read_text",
           "read_json", "parse_json", "describe_size", "MAX_JSON_BYTES", "MAX_RUN_FILE_BYTES",
           "MAX_TRACE_BYTES"]

#: plans, model specs, device profiles, safetensors indexes: the largest shipped spec is ~1 MiB
MAX_JSON_BYTES = 64 << 20
#: a saved run's zip file (each member has its own cap, see ``offload_lab.record.run``)
MAX_RUN_FILE_BYTES = 2 << 30
#: a torch.profiler trace on disk, and the JSON text a gzipped one may decompress to: traces are
#: streamed (memory stays bounded), so the cap only bounds the time spent on one
MAX_TRACE_BYTES = 16 << 30


class InputFileError(OffloadLabError, ValueError):
    """A path that cannot be read as the file asked for: missing, not a regular file (a FIFO,
    a device, a directory), over the size cap of its kind, not UTF-8, or not JSON."""


class MissingInputError(InputFileError, FileNotFoundError):
    """An input path that does not exist (also a :class:`FileNotFoundError`)."""


_KINDS: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def describe_size(n: int) -> str:
    """Bytes in binary units, one decimal where it matters.

    >>> describe_size(64 << 20), describe_size(int(6.2 * 2**30)), describe_size(12)
    ('64 MiB', '6.2 GiB', '12 bytes')
    """
    if n < 1024:
        return f"{n} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if n == int(n) or n >= 100 else f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def _accepted(cap_bytes: int | None, accepted: str | None) -> str:
    if accepted:
        return accepted
    return "a regular file" + (f" of at most {describe_size(cap_bytes)}" if cap_bytes is not None else "")


def _check_stat(st: os.stat_result, p: Path, what: str, cap_bytes: int | None, accepted: str | None) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise InputFileError(f"{what} {str(p)!r} is {kind}, not a regular file; "
                             f"accepted: {_accepted(cap_bytes, accepted)}")
    if cap_bytes is not None and st.st_size > cap_bytes:
        raise InputFileError(f"{what} {str(p)!r} is {describe_size(st.st_size)}, over the cap of "
                             f"{describe_size(cap_bytes)}; accepted: {_accepted(cap_bytes, accepted)}")


def check_input(path: str | os.PathLike, what: str, cap_bytes: int | None, accepted: str | None = None) -> Path:
    """``path`` when it names an existing regular file of at most ``cap_bytes`` (None: no cap).

    Decided by ``os.stat`` (symlinks followed) without opening anything, so a FIFO or a device
    is refused rather than read. ``what`` names the file in the message ("plan", "device
    profile"); ``accepted`` replaces the default "a regular file of at most …".

    >>> check_input("/", "plan", 1 << 20)
    Traceback (most recent call last):
    ...
    offload_lab.reading.InputFileError: plan '/' is a directory, not a regular file; accepted: a regular file of at most 1 MiB
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise MissingInputError(f"no such {what}: {str(p)!r}; accepted: {_accepted(cap_bytes, accepted)}") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise InputFileError(f"cannot read {what} {str(p)!r}: {why}") from None
    _check_stat(st, p, what, cap_bytes, accepted)
    return p


def open_binary(path: str | os.PathLike, what: str, cap_bytes: int | None, accepted: str | None = None) -> IO[bytes]:
    """``path`` opened for binary reading after :func:`check_input`, re-checked on the descriptor.

    The open does not block (``O_NONBLOCK``: a FIFO put in place after the check is refused,
    not waited on); the caller closes the file (a ``with`` block).
    """
    p = check_input(path, what, cap_bytes, accepted)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputFileError(f"cannot read {what} {str(p)!r}: {e.strerror or e}") from None
    try:
        _check_stat(os.fstat(fd), p, what, cap_bytes, accepted)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike, what: str, cap_bytes: int, accepted: str | None = None) -> bytes:
    """The bytes of a checked regular file; never more than ``cap_bytes`` are read, even from a
    file that grows after the check."""
    with open_binary(path, what, cap_bytes, accepted) as fh:
        try:
            data = fh.read(cap_bytes + 1)
        except OSError as e:
            raise InputFileError(f"cannot read {what} {str(path)!r}: {e.strerror or e}") from None
    if len(data) > cap_bytes:
        raise InputFileError(f"{what} {str(path)!r} holds more than {describe_size(cap_bytes)}, its cap; "
                             f"accepted: {_accepted(cap_bytes, accepted)}")
    return data


def read_text(path: str | os.PathLike, what: str, cap_bytes: int, accepted: str | None = None) -> str:
    """The UTF-8 text of a checked regular file (a leading byte-order mark is dropped)."""
    data = read_bytes(path, what, cap_bytes, accepted)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{what} {str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start}); "
                             f"accepted: {_accepted(cap_bytes, accepted)}") from None


def parse_json(data: str | bytes, where: str, object_pairs_hook: Callable[[list], Any] | None = None) -> Any:
    """JSON text decoded, or one-line :class:`InputFileError` saying ``where`` is not JSON.

    Nesting deeper than Python's parser takes (about a thousand levels) is refused as "nested
    too deeply", not left to raise ``RecursionError``.

    >>> parse_json("[" * 100_000, "plan 'p.json'")
    Traceback (most recent call last):
    ...
    offload_lab.reading.InputFileError: plan 'p.json' is not valid JSON: nested too deeply
    """
    try:
        return json.loads(data, object_pairs_hook=object_pairs_hook)
    except RecursionError:
        raise InputFileError(f"{where} is not valid JSON: nested too deeply") from None
    except UnicodeDecodeError as e:
        raise InputFileError(f"{where} is not valid JSON: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except ValueError as e:  # JSONDecodeError, and integers past Python's digit limit
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputFileError(f"{where} is not valid JSON: {msg}") from None


def read_json(path: str | os.PathLike, what: str, cap_bytes: int, accepted: str | None = None,
              object_pairs_hook: Callable[[list], Any] | None = None) -> Any:
    """The JSON document of a checked regular file of at most ``cap_bytes``."""
    return parse_json(read_bytes(path, what, cap_bytes, accepted), f"{what} {str(path)!r}", object_pairs_hook)


def json_document(path_or_text: str | os.PathLike, what: str,
                  error: type[Exception] = InputFileError) -> Any:
    """The JSON document ``path_or_text`` holds: JSON text itself (it starts with ``{``), or the
    path of a regular file of at most :data:`MAX_JSON_BYTES`; any refusal is one ``error`` line.

    >>> json_document('{"a": 1}', "model spec")
    {'a': 1}
    >>> json_document("/dev/zero", "model spec", ValueError)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: model spec '/dev/zero' is a character device, not a regular file; ...
    """
    text, where = str(path_or_text), what
    try:
        if not text.lstrip().startswith("{"):
            where = f"{what} {text!r}"
            # a regular file within the cap, never a FIFO or a device
            text = read_text(path_or_text, what, MAX_JSON_BYTES)
        return parse_json(text, where)
    except InputFileError as e:
        if error is InputFileError:
            raise
        raise error(str(e)) from None
