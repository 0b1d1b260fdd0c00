"""Streaming reader of chrome trace JSON: events one at a time, never ``json.load`` of the file."""

from __future__ import annotations

import codecs
import functools
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from itertools import repeat
from pathlib import Path
from typing import IO, Any

from offload_lab.reading import (
    InputFileError,
    MissingInputError,
    describe_size,
    open_binary,
)
from offload_lab.record.kineto.fast import BlockDecoder
from offload_lab.record.kineto.options import (
    DEFAULT_OPTIONS,
    MAX_VALUE_CHARS,
    TraceImportError,
    TraceImportOptions,
)

_CHUNK = 1 << 20
# A JSON error this close to the end of the buffer may just be an event cut by the chunk edge.
_EDGE = 16
_WS = re.compile(r"[ \t\n\r]*")
_LOW = 1 << 16        # refill before fewer than this many characters are left
__all__ = ["TraceImportError", "TraceFormatError", "TraceText", "Reader", "open_trace", "iter_trace_events",
           "MAX_VALUE_CHARS"]


class TraceFormatError(TraceImportError):
    """A file that is not a readable chrome trace; the message says what is wrong and where.

    >>> str(TraceFormatError("trace.json: event 12 has no 'ts'"))
    "trace.json: event 12 has no 'ts'"
    """



class TraceText:
    """Decoded text of a (possibly gzipped) file, read chunk by chunk, with byte offsets."""

    def __init__(self, fh: Any, name: str, gz: bool, options: TraceImportOptions = DEFAULT_OPTIONS):
        self.fh, self.name, self.gz = fh, name, gz
        self.max_value_chars = options.max_value_chars
        self.max_text = options.text_cap(gz)
        self.dec = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.base = 0          # byte offset (of the decompressed stream) of buf[0]
        self.eof = False
        self.cut_gzip = False  # the gzip stream ended before its end-of-stream marker
        self.read = 0          # bytes of (decompressed) text read so far

    def refill(self, pos: int) -> int:
        """Drop ``buf[:pos]``, append one more chunk; returns the new ``pos`` (0)."""
        if self.eof:
            return pos
        if len(self.buf) - pos > self.max_value_chars:
            raise TraceFormatError(f"{self.name}: a JSON value at {self.where(pos)} goes on for more than "
                                   f"{describe_size(self.max_value_chars)}; a trace event is at most that long")
        try:
            data = self.fh.read(_CHUNK)
        except EOFError:
            data, self.cut_gzip = b"", True
        except (OSError, *GZIP_ERRORS) as e:  # BadGzipFile, CRC errors
            raise TraceFormatError(
                f"{self.name}: corrupt gzip data near byte {self.offset(len(self.buf))} of the "
                f"decompressed stream ({e})") from None
        try:
            text = self.dec.decode(data, final=not data)
        except UnicodeDecodeError as e:
            raise TraceFormatError(
                f"{self.name}: not UTF-8 text near byte {self.offset(len(self.buf)) + e.start}") from None
        if not data:
            self.eof = True
        self.read += len(data)
        if self.read > self.max_text:
            raise TraceFormatError(f"{self.name}: the trace holds more than {describe_size(self.max_text)} of "
                                   f"JSON{' once decompressed' if self.gz else ''}, the most a trace may hold")
        self.base = self.offset(pos)
        self.buf = self.buf[pos:] + text
        return 0

    def offset(self, pos: int) -> int:
        """Byte offset of ``buf[pos]`` (characters are bytes in ASCII text, the usual case)."""
        if self.buf.isascii():  # O(1) for a str: no copy of the head to measure it
            return self.base + pos
        head = self.buf[:pos]
        return self.base + (len(head) if head.isascii() else len(head.encode("utf-8")))

    def where(self, pos: int) -> str:
        return f"byte {self.offset(pos)}" + (" of the decompressed stream" if self.gz else "")


class Reader:
    """Walks the top level of a chrome trace; :meth:`events` yields batches of its events."""

    # top-level keys whose (small) values are kept for meta
    KEEP = ("schemaVersion", "deviceProperties", "distributedInfo", "traceName", "displayTimeUnit",
            "baseTimeNanoseconds")

    def __init__(self, text: TraceText, read_python_functions: bool = True, decode_all: bool = False):
        self.t = text
        self.decode_all = decode_all
        self.pos = 0
        self.header: dict[str, Any] = {}
        self.keys: list[str] = []
        self.n_events = 0
        # the batch last handed out: (its start in buf, index of its first event, event heads)
        self._batch: tuple = (None, 0, None, None)
        self._scan = json.scanner.make_scanner(json.JSONDecoder())
        self._layouts = _layouts(read_python_functions)
        #: ``fast(events, index) -> bool``: takes a framed block decoded whole (its events as
        #: :class:`~offload_lab.record.kineto.fast.BlockDecoder` gives them, the first one's index
        #: in traceEvents); False sends the block down the per-event path (set by the collector)
        self.fast: Callable[[list, int], bool] | None = None
        self._blocks: Any = None

    # -- low level -------------------------------------------------------------------------
    def _truncated(self, what: str) -> TraceFormatError:
        t = self.t
        after = (f"after event {self.n_events - 1}" if self.n_events else "before the first event")
        why = " (the gzip stream ends before its end marker)" if t.cut_gzip else ""
        return TraceFormatError(f"{t.name}: truncated {after} at {t.where(len(t.buf))}{why}: "
                                f"the file ends inside {what}")

    def _peek(self, what: str) -> str:
        """Skip whitespace; the next character (refilling as needed)."""
        t = self.t
        while True:
            self.pos = _WS.match(t.buf, self.pos).end()
            if self.pos < len(t.buf):
                return t.buf[self.pos]
            if t.eof:
                raise self._truncated(what)
            self.pos = t.refill(self.pos)

    def _value(self, what: str) -> Any:
        """Decode one JSON value at ``pos``, reading more text while it is cut by the chunk edge."""
        t = self.t
        while True:
            buf, pos = t.buf, self.pos
            try:
                obj, end = self._scan(buf, pos)
            except RecursionError:
                raise TraceFormatError(f"{t.name}: invalid JSON in {what} at {t.where(pos)}: nested too "
                                       f"deeply for a JSON parser") from None
            except StopIteration as e:
                # no value could start here; C's scanner also says so for a value nested inside,
                # with the position where it looked
                at = e.value if isinstance(e.value, int) and e.value >= pos else pos
                if len(buf) - at < _EDGE and not t.eof:
                    self.pos = t.refill(pos)
                    continue
                if _cut(buf[at:]):
                    raise self._truncated(what) from None
                raise TraceFormatError(f"{t.name}: invalid JSON in {what} at {t.where(at)}: "
                                       f"expected a value, found {buf[at:at + 20]!r}") from None
            except json.JSONDecodeError as e:
                unterminated = e.msg.startswith("Unterminated string")
                if not t.eof and (unterminated or e.pos >= len(buf) - _EDGE):
                    self.pos = t.refill(pos)
                    continue
                if unterminated or _cut(buf[e.pos:]):
                    raise self._truncated(what) from None
                raise TraceFormatError(f"{t.name}: invalid JSON in {what} at {t.where(e.pos)}: "
                                       f"{e.msg}") from None
            if end >= len(buf) and not t.eof:
                # a bare number may go on in the next chunk: decode again with more text
                self.pos = t.refill(pos)
                continue
            self.pos = end
            return obj

    # -- structure -------------------------------------------------------------------------
    def index(self, j: int) -> int:
        """Index in traceEvents of event ``j`` of the batch last handed out (counted on demand)."""
        start, base, heads, sep = self._batch
        if heads is None:
            return base + j
        # the separator before an event ends two characters into it ('{' + newline or quote)
        return base + self.t.buf.count(sep, start, heads[j] + 2)

    def events(self) -> Iterator[tuple[list, int, int]]:
        t = self.t
        self.pos = t.refill(0)
        if t.buf.startswith("\ufeff"):
            self.pos = 1
        try:
            c = self._peek("the top level")
        except TraceFormatError:
            if t.cut_gzip:
                raise
            raise TraceFormatError(f"{t.name}: not a chrome trace: the file is empty") from None
        if c == "[":  # the chrome "JSON Array Format": the file is the event array itself
            self.pos += 1
            yield from self._array()
            self.keys.append("traceEvents")
            self._end_of_file()
            return
        if c != "{":
            raise TraceFormatError(f"{t.name}: not a chrome trace: the top level is not a JSON object "
                                   f"(starts with {t.buf[self.pos:self.pos + 20]!r} at {t.where(self.pos)})")
        self.pos += 1
        first = True
        while True:
            c = self._peek("the top-level object")
            if c == "}":
                self.pos += 1
                break
            if not first:
                if c != ",":
                    raise TraceFormatError(f"{t.name}: invalid JSON at {t.where(self.pos)}: expected ',' "
                                           f"or '}}' between top-level keys, found {c!r}")
                self.pos += 1
                self._peek("the top-level object")
            first = False
            at = self.pos
            key = self._value("a top-level key")
            if not isinstance(key, str):
                raise TraceFormatError(f"{t.name}: invalid JSON at {t.where(at)}: a top-level key must "
                                       f"be a string, found {key!r}")
            if self._peek(f"the value of {key!r}") != ":":
                raise TraceFormatError(f"{t.name}: invalid JSON at {t.where(self.pos)}: expected ':' "
                                       f"after top-level key {key!r}")
            self.pos += 1
            self.keys.append(key)
            if key == "traceEvents":
                c = self._peek("traceEvents")
                if c != "[":
                    raise TraceFormatError(f"{t.name}: not a chrome trace: traceEvents at "
                                           f"{t.where(self.pos)} is not an array (starts with {c!r})")
                self.pos += 1
                yield from self._array()
            else:
                self._peek(f"the value of top-level key {key!r}")
                value = self._value(f"the value of top-level key {key!r}")
                if key in self.KEEP:
                    self.header[key] = value
        if "traceEvents" not in self.keys:
            raise TraceFormatError(f"{t.name}: not a chrome trace: top level has no traceEvents "
                                   f"(keys: {self.keys})")
        self._end_of_file()

    def _end_of_file(self) -> None:
        t = self.t
        while True:
            self.pos = _WS.match(t.buf, self.pos).end()
            if self.pos < len(t.buf):
                raise TraceFormatError(f"{t.name}: unexpected data after the trace at {t.where(self.pos)}: "
                                       f"{t.buf[self.pos:self.pos + 20]!r}")
            if t.eof:
                if t.cut_gzip:
                    raise TraceFormatError(f"{t.name}: truncated gzip stream after the end of the trace "
                                           f"at {t.where(self.pos)}")
                return
            self.pos = t.refill(self.pos)

    def _array(self) -> Iterator[tuple[list, int, int]]:
        """The elements of traceEvents in batches ``(pairs, events, cpu_op marks)``.

        ``pairs`` holds ``(event, _)`` for the events decoded; ``events`` counts every event the
        batch covers; ``cpu_op marks`` counts the ``cpu_op`` rows in it, decoded or not.
        :meth:`index` turns a position in the last batch into an index in traceEvents.

        Rows the import never reads (``cpu_op``, flow arrows, ``python_function`` frames other
        than ``nn.Module``: most of a trace) are not decoded when the file is laid out as torch
        writes it (:func:`_layouts`): there, events are separated by newlines that JSON allows
        nowhere inside a string, so a block of whole events is framed with ``str.rfind`` and
        ``str.count`` (in C) without decoding anything; within it a regex finds the heads of the
        rows that are read, and only those are decoded (and so validated). When a block does
        not add up or decode cleanly, or the file has another layout (one line, as HTA's test
        data), every event is decoded one by one, which also pins any error to its event and
        byte.
        """
        # One loop over the whole file, past ~80 lines on purpose: the buffer, position and
        # batch state live in locals (the hot path of the import), and splitting it would pass
        # them back and forth for every event.
        t = self.t
        scan, ws = self._scan, _WS.match
        kineto, lines = self._layouts
        idx = 0
        fast = not self.decode_all
        pending: list = []   # events decoded one by one, not yet handed out
        missed = None        # the buffer in which no block was found
        slow_until = 0       # events up to this index are decoded one by one
        if self._peek("traceEvents") == "]":
            self.pos += 1
            return
        buf, pos = t.buf, self.pos
        low = len(buf) - _LOW
        while True:
            if pos > low and not t.eof:
                pos = t.refill(pos)
                buf = t.buf
                low = len(buf) - _LOW
            lay = (kineto if buf.startswith(kineto.start, pos) else lines if buf.startswith(lines.start, pos)
                   else None) if fast and idx >= slow_until else None
            j = -1
            if lay is not None and (t.base, len(buf)) != missed:
                j = buf.rfind(lay.sep, pos)
                if j <= pos:  # no whole block in this buffer: do not look again until it changes
                    missed = (t.base, len(buf))
            if j > pos and self.fast is not None:
                # the whole block in one C call: JSON that decodes from an event's start to the
                # end of a separator's '}' is a whole number of events, so nothing is counted
                end = j + lay.end_off
                if self._blocks is None:
                    self._blocks = BlockDecoder()
                evs = self._blocks.decode(buf[pos:end])
                if evs is not None:
                    if pending:
                        self._batch = (None, idx - len(pending), None, None)
                        yield pending, len(pending), None
                        pending = []
                    if self.fast(evs, idx):
                        idx += len(evs)
                        self.n_events = idx
                        pos = j + lay.next_off
                        continue
            if j > pos:
                # [pos, end) holds whole events; the next one starts at j + next_off. As many
                # events as separators + 1, or the block is not what it seems (a missing comma,
                # another layout): then it is decoded event by event
                end = j + lay.end_off
                n = buf.count(lay.sep, pos, end) + 1
                ok = lay.framed(buf, pos, end, n)
                if ok:
                    heads = [m.start() for m in lay.heads.finditer(buf, pos, end)]
                    if lay.first is not None and lay.first.match(buf, pos) and heads[:1] != [pos]:
                        heads.insert(0, pos)
                    try:
                        pairs = list(map(scan, repeat(buf, len(heads)), heads))
                        ok = not pairs or pairs[-1][1] <= end
                    except (StopIteration, json.JSONDecodeError, RecursionError):
                        ok = False
                if ok:
                    if pending:
                        self._batch = (None, idx - len(pending), None, None)
                        yield pending, len(pending), None
                        pending = []
                    self._batch = (pos, idx, heads, lay.sep)
                    yield pairs, n, buf.count(lay.cpu_marker, pos, end)
                    idx += n
                    self.n_events = idx
                    pos = j + lay.next_off
                    continue
                # decode this block event by event: that finds what is wrong, or gets past a
                # quirk of the layout
                slow_until = idx + n
            try:
                ev, end = scan(buf, pos)
                if end >= len(buf):
                    raise StopIteration  # may go on in the next chunk
                pos = end
            except (StopIteration, json.JSONDecodeError, RecursionError):
                # cut by the chunk edge (read more), or really invalid: the slow path decides
                self.pos = pos
                self.n_events = idx
                self._peek(f"event {idx}")
                ev = self._value(f"event {idx}")
                buf, pos = t.buf, self.pos
                low = len(buf) - _LOW
            idx += 1
            self.n_events = idx
            pending.append((ev, None))
            if len(pending) >= 4096:
                self._batch = (None, idx - len(pending), None, None)
                yield pending, len(pending), None
                pending = []
            pos = ws(buf, pos).end()
            if pos >= len(buf):
                self.pos = pos
                c = self._peek(f"traceEvents (after event {idx - 1})")
                buf, pos = t.buf, self.pos
                low = len(buf) - _LOW
            else:
                c = buf[pos]
            if c == ",":
                pos = ws(buf, pos + 1).end()
                if pos >= len(buf):
                    self.pos = pos
                    self._peek(f"traceEvents (after event {idx - 1})")
                    buf, pos = t.buf, self.pos
                    low = len(buf) - _LOW
                continue
            if c == "]":
                self.pos = pos + 1
                if pending:
                    self._batch = (None, idx - len(pending), None, None)
                    yield pending, len(pending), None
                return
            raise TraceFormatError(f"{t.name}: invalid JSON after event {idx - 1} at {t.where(pos)}: "
                                   f"expected ',' or ']' between events, found {buf[pos:pos + 20]!r}")


class _Layout:
    """How a writer lays out its events, so whole events can be framed without decoding them.

    ``sep`` separates two events (it holds the only newline(s) there: JSON has no raw newline
    inside a string); a block ends ``end_off`` characters into the last ``sep`` and the next
    event starts ``next_off`` into it. ``heads`` finds the events that must be decoded (every
    event but the rows the import ignores); ``first`` does so for a block's first event where
    ``heads`` needs the separator before it.
    """

    def __init__(self, sep: str, end_off: int, next_off: int, start: str, head: str,
                 cpu_marker: str, skip: str, first: str | None):
        self.sep, self.end_off, self.next_off, self.start = sep, end_off, next_off, start
        self.cpu_marker = cpu_marker
        self._rx = (head + "(?!" + skip + ")", first + "(?!" + skip + ")" if first else None)
        self.is_lines = first is not None

    @functools.cached_property
    def heads(self) -> re.Pattern:
        # compiled when a block is first read event by event (never, when msgspec reads them all)
        return re.compile(self._rx[0])

    @functools.cached_property
    def first(self) -> re.Pattern | None:
        return re.compile(self._rx[1]) if self._rx[1] else None

    def framed(self, buf: str, pos: int, end: int, n: int) -> bool:
        """Whether [pos, end) is exactly ``n`` events in this layout."""
        if not self.is_lines:  # Kineto: one head line per event
            return buf.count(self.start, pos, end) == n
        return buf.count("\n", pos, end) == n - 1  # one event per line


@functools.cache
def _layouts(read_python_functions: bool) -> tuple[_Layout, _Layout]:
    """Kineto's own writer (torch <= 2.x: first keys on one line; newer: one key per line) and
    torch's Python writer (``use_python_export=True``: one event per line, no spaces)."""
    s = r"\s*"
    skip = [rf'"ph":{s}"X",{s}"cat":{s}"(?:cpu_op|Operator)",{s}"name":{s}"(?!ProfilerStep#)',
            rf'"ph":{s}"[sf]",']
    if not read_python_functions:
        skip.append(rf'"ph":{s}"X",{s}"cat":{s}"python_function",{s}"name":{s}"(?!nn\.Module: )')
    skip_rx = "|".join(skip)
    kineto = _Layout("\n  },\n  {\n", 4, 8, '{\n    "', r'\{\n {4}(?=")', '"cat": "cpu_op",', skip_rx, None)
    lines = _Layout('},\n{"', 1, 3, '{"', r'(?<=\n)\{(?=")', '"cat":"cpu_op",', skip_rx, r'\{(?=")')
    return kineto, lines


_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_NUMBER_PREFIX = re.compile(r"-?\d*(?:\.\d*)?(?:[eE][-+]?\d*)?")


def _cut(rest: str) -> bool:
    """Whether the text left at the end of the file is the start of a value (a cut), not junk."""
    rest = rest.strip()
    return (not rest or any(lit.startswith(rest) for lit in _LITERALS)
            or _NUMBER_PREFIX.fullmatch(rest) is not None)


try:  # ISA-L's inflate reads the same gzip stream about 3x faster than zlib's
    from isal import isal_zlib as _inflate

    GZIP_ERRORS: tuple[type[Exception], ...] = (zlib.error, _inflate.error)
except ImportError:
    _inflate = zlib
    GZIP_ERRORS = (zlib.error,)


class _Gunzip:
    """gzip decompression that hands out every byte it could decompress before a cut (the
    ``gzip`` module drops the last block's output when it raises ``EOFError``)."""

    def __init__(self, fh: IO[bytes]):
        self.fh = fh
        self.d = _inflate.decompressobj(wbits=31)

    def read(self, n: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < n:
            if self.d.eof:
                data = self.d.unused_data or self.fh.read(_CHUNK)
                if not data:
                    break  # the clean end of the last gzip member
                self.d = _inflate.decompressobj(wbits=31)  # another member follows
            else:
                data = self.d.unconsumed_tail or self.fh.read(_CHUNK)
                if not data:
                    if got:
                        break  # hand out what there is; the next read reports the cut
                    raise EOFError("the gzip stream ends before its end marker")
            out = self.d.decompress(data, n - got)
            parts.append(out)
            got += len(out)
        return b"".join(parts)

    def __enter__(self) -> _Gunzip:
        return self

    def __exit__(self, *exc: object) -> None:
        self.fh.close()


def open_trace(path: Path, options: TraceImportOptions = DEFAULT_OPTIONS) -> tuple[Any, bool]:
    """The trace file opened (a regular file of at most ``options.max_bytes``: never a FIFO or a
    device), through a gunzip when its content is gzip."""
    try:
        fh = open_binary(path, "trace", options.max_bytes,
                         accepted=f"a torch.profiler trace (.json or .json.gz) of at most "
                                  f"{describe_size(options.max_bytes)}")
    except MissingInputError:
        raise
    except InputFileError as e:
        raise TraceFormatError(str(e)) from None
    magic = fh.read(2)
    fh.seek(0)
    if magic == b"\x1f\x8b":  # by content, not by name: a .json may be gzipped and vice versa
        return _Gunzip(fh), True
    return fh, False


def iter_trace_events(path: str | os.PathLike, options: TraceImportOptions = DEFAULT_OPTIONS) -> Iterator[dict]:
    """Stream the ``traceEvents`` of a chrome trace (``.json`` or gzipped), one dict at a time.

    Memory stays bounded by one chunk plus one event, whatever the size of the file; the size
    caps are those of ``options`` (a :class:`TraceImportOptions`).

    >>> sum(1 for e in iter_trace_events("tests/data/traces/hta-alexnet.json.gz"))  # doctest: +SKIP
    1408
    """
    path = Path(path)
    if not isinstance(options, TraceImportOptions):
        raise TraceImportError(f"options = {options!r:.80}; accepted: a TraceImportOptions")
    raw, gz = open_trace(path, options)
    with raw:
        reader = Reader(TraceText(raw, path.name, gz, options), decode_all=True)
        for pairs, _, _ in reader.events():
            for ev, _ in pairs:
                yield ev
