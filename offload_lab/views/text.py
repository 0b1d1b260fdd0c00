"""Numbers and labels as people read them: the one place every surface formats text.

Seconds (ms or µs where short), ratios, percentages, byte counts, plain-text tables, and the
labels of a set of runs split into what they share and what tells them apart. Figures, the
report, the command line, the magic and the widgets all format through here, so a step time
reads the same everywhere. Nothing here escapes HTML: callers that write HTML escape (the
report through its autoescaping template, figures through :func:`offload_lab.views.figures.esc`).

>>> fmt_seconds(0.0123), fmt_ratio(1.8449), fmt_percent(0.153), fmt_bytes(1288490188)
('12.3 ms', '×1.84', '15 %', '1.20 GiB')
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from offload_lab.checks import is_number
from offload_lab.errors import OffloadLabError
from offload_lab.units import format_bytes

__all__ = ["TextError", "fmt_step", "step_band", "evidence_text", "fmt_bytes", "fmt_number", "fmt_percent", "fmt_ratio", "fmt_seconds",
           "split_labels", "with_part", "text_table", "time_unit", "wrap"]


class TextError(OffloadLabError, ValueError):
    """An argument the formatters cannot read (a table that is not a frame, ...)."""


def _finite(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def fmt_seconds(x: Any) -> str:
    """Seconds in a readable unit, three significant digits; ``–`` for a missing value.

    >>> fmt_seconds(1.034), fmt_seconds(0.9999), fmt_seconds(0.0123), fmt_seconds(3.5e-5), fmt_seconds(0)
    ('1.03 s', '1 s', '12.3 ms', '35 µs', '0 s')
    >>> fmt_seconds(None), fmt_seconds(float("nan")), fmt_seconds("x")
    ('–', '–', '–')
    """
    v = _finite(x)
    if v is None:
        return "–"
    if v == 0:
        return "0 s"
    a = abs(v)
    # compare after rounding to 3 digits, so 0.9999 s prints as "1 s", not "1e+03 ms"
    if float(f"{a:.3g}") >= 1:
        return f"{v:.3g} s"
    if float(f"{a * 1e3:.3g}") >= 1:
        return f"{v * 1e3:.3g} ms"
    return f"{v * 1e6:.3g} µs"


def fmt_ratio(q: Any) -> str:
    """``×1.84`` — two decimals below 10, three significant digits above; ``–`` when missing.

    >>> fmt_ratio(1.0), fmt_ratio(1.8449), fmt_ratio(468.2), fmt_ratio(None)
    ('×1.00', '×1.84', '×468', '–')
    """
    v = _finite(q)
    if v is None:
        return "–"
    return f"×{v:.2f}" if abs(v) < 10 else f"×{v:.3g}"


def fmt_percent(share: Any) -> str:
    """A share (0..1) as a whole percentage.

    >>> fmt_percent(0.153), fmt_percent(1.0), fmt_percent(float("nan"))
    ('15 %', '100 %', '–')
    """
    v = _finite(share)
    return "–" if v is None else f"{v * 100:.0f} %"


def fmt_number(x: Any, spec: str = ".3g") -> str:
    """A number with a format spec (``.2f``, ``.3g``); ``–`` when missing, other values as text.

    >>> fmt_number(2.3456, ".2f"), fmt_number(float("inf")), fmt_number("n/a")
    ('2.35', '–', 'n/a')
    """
    v = _finite(x)
    if v is None:
        return "–" if x is None or isinstance(x, (int, float)) else str(x)
    return format(v, spec)


def fmt_bytes(n: Any) -> str:
    """A byte count in binary units (:func:`offload_lab.units.format_bytes`); ``–`` when missing.

    >>> fmt_bytes(3 * 2**30), fmt_bytes(None), fmt_bytes(True)
    ('3.00 GiB', '–', '–')
    """
    v = _finite(n)
    return "–" if v is None else format_bytes(v)


def time_unit(largest_s: Any) -> tuple[float, str]:
    """Scale and unit for a time axis whose largest value is ``largest_s`` seconds.

    Axes read in ms when everything is under a second (no ticks like ``0.002 s``), in µs under
    a millisecond. Multiply seconds by the scale.

    >>> time_unit(2.5), time_unit(0.004), time_unit(3e-5), time_unit(float("nan"))
    ((1.0, 's'), (1000.0, 'ms'), (1000000.0, 'µs'), (1.0, 's'))
    """
    v = _finite(largest_s)
    if v is None or abs(v) >= 1 or v == 0:
        return 1.0, "s"
    if abs(v) >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def text_table(frame: Any, right: Sequence[str] = ()) -> str:
    """A frame as aligned plain text: columns left-aligned, those named in ``right`` right-aligned.

    >>> import pandas as pd
    >>> print(text_table(pd.DataFrame({"run": ["pinned", "pageable"], "step": ["1.03 s", "1.9 s"]}),
    ...                  right=("step",)))
    run         step
    pinned    1.03 s
    pageable   1.9 s
    """
    if not hasattr(frame, "columns") or not hasattr(frame, "itertuples"):
        raise TextError(f"text_table() got {type(frame).__name__} {frame!r:.80}; expected a pandas DataFrame")
    cols = [str(c) for c in frame.columns]
    cells = [[str(v) for v in row] for row in frame.itertuples(index=False)]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if c in right else v.ljust(w)
                         for v, w, c in zip(values, widths, cols)).rstrip()

    return "\n".join([line(cols)] + [line(r) for r in cells])


# labels of runs are built from parts such as "rtx4090-pcie4 · 480p tokens · pinned (simulated)"
_SEP = re.compile(r"\s+[·|/,]\s+")
_SIM = re.compile(r"\s*\((?:simulated|sim)\)\s*", re.I)


def _parts(label: str) -> list[str]:
    return [p.strip() for p in _SEP.split(_SIM.sub(" ", str(label)).strip()) if p.strip()]


def with_part(label: Any, part: str) -> str:
    """``label`` with `` · part`` added (labels never carry the simulated mark: views add it).

    >>> with_part("14B pageable p1", "before-compute")
    '14B pageable p1 · before-compute'
    """
    return f"{label} · {part}"


def split_labels(labels: Sequence[Any]) -> tuple[str, list[str]]:
    """What a set of labels shares, and what tells each apart (in the label's own order).

    Labels are split into parts at `` · `` (and `` | ``, `` / ``, ``, ``); parts every label has
    move into the shared text (a figure title), the rest stay. ``(simulated)`` is dropped from
    the parts: figures mark simulated runs themselves. A label with nothing of its own keeps
    its full text, so no label ever becomes empty.

    >>> split_labels(["rtx4090-pcie4 · 480p tokens · pinned (simulated)",
    ...               "rtx4090-pcie4 · 480p tokens · pageable (simulated)"])
    ('rtx4090-pcie4 · 480p tokens', ['pinned', 'pageable'])
    >>> split_labels(["a", "b"])
    ('', ['a', 'b'])
    """
    labels = [str(x) for x in labels]
    parts = [_parts(x) for x in labels]
    if len(labels) < 2:
        return "", [" · ".join(p) or x for p, x in zip(parts, labels)]
    common = [p for p in parts[0] if all(p in q for q in parts[1:])]
    out = []
    for p, full in zip(parts, labels):
        own = [x for x in p if x not in common]
        out.append(" · ".join(own) if own else (" · ".join(p) or full))
    return " · ".join(common), out


def wrap(text: Any, width: int = 28, sep: str = "<br>") -> str:
    """Break ``text`` at spaces so no line is longer than ``width`` (never cuts a word).

    Figures wrap long labels instead of cutting them (a cut hides what differs). Escape before
    wrapping when ``sep`` is markup.

    >>> wrap("rtx4090-pcie4 · 480p tokens · pinned", 16)
    'rtx4090-pcie4 ·<br>480p tokens ·<br>pinned'
    """
    words, lines, cur = str(text).split(" "), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    lines.append(cur)
    return sep.join(lines)


def step_band(meta: Any) -> float | None:
    """The ± relative band of a simulated run's step time: the held-out error of its regime.

    ``meta["evidence"]["band"]`` (:mod:`offload_lab.simulation.evidence`); a run saved before
    predictions carried evidence falls back to its profile's ``step_error``. None for a measured
    run and for a prediction no measured run backs (unconfirmed, derived).

    >>> step_band({"simulated": True, "evidence": {"status": "held-out", "band": 0.039}})
    0.039
    >>> step_band({"simulated": True, "evidence": {"status": "unconfirmed", "band": None}}) is None
    True
    >>> step_band({"simulated": False}) is None
    True
    """
    if not isinstance(meta, dict) or not meta.get("simulated"):
        return None
    ev = meta.get("evidence")
    if isinstance(ev, dict):
        e = ev.get("band") if ev.get("status") == "held-out" else None
    else:
        prof = meta.get("profile")
        e = prof.get("step_error") if isinstance(prof, dict) else None
    return float(e) if is_number(e) and e >= 0 else None


def evidence_text(meta: Any) -> str:
    """What a simulated run's step time rests on, in a few words ('' for a measured run).

    >>> evidence_text({"simulated": True, "evidence": {"status": "held-out", "band": 0.039}})
    '± 3.9 % (simulated; held-out error of its regime)'
    >>> evidence_text({"simulated": True, "evidence": {"status": "unconfirmed", "band": None}})
    '(simulated; unconfirmed — no GPU run of this issue order yet)'
    """
    if not isinstance(meta, dict) or not meta.get("simulated"):
        return ""
    band = step_band(meta)
    ev = meta.get("evidence")
    status = ev.get("status") if isinstance(ev, dict) else None
    if band is not None:
        return f"± {band * 100:.1f} % (simulated; held-out error of {'its regime' if status else 'the profile'})"
    if status == "unconfirmed":
        return "(simulated; unconfirmed — no GPU run of this issue order yet)"
    if status == "derived":
        return "(simulated; derived — no measured run of this device)"
    return "(simulated)"


def fmt_step(seconds: Any, meta: Any = None) -> str:
    """A step time, with what it rests on when it is simulated: a ± band where measured runs of
    its regime back it, else the word that says none does.

    >>> fmt_step(0.6215, {"simulated": True, "evidence": {"status": "held-out", "band": 0.047}})
    '622 ms ± 4.7 % (simulated; held-out error of its regime)'
    >>> fmt_step(0.6074, {"simulated": True, "evidence": {"status": "unconfirmed", "band": None}})
    '607 ms (simulated; unconfirmed — no GPU run of this issue order yet)'
    >>> fmt_step(0.6215, {"simulated": False})
    '622 ms'
    """
    note = evidence_text(meta)
    return f"{fmt_seconds(seconds)} {note}" if note else fmt_seconds(seconds)
