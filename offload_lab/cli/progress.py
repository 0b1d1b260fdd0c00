"""A plain-text progress bar on stderr for the long ``offload-lab`` commands."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "this_rank"]


def this_rank() -> int:
    """This process's global rank: ``RANK`` from the launcher, else an initialised process
    group's, else 0 (torch is not imported for it).

    >>> this_rank() if "RANK" not in os.environ else 0
    0
    """
    r = os.environ.get("RANK", "")
    if r.isdigit():
        return int(r)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


class Progress:
    """A plain-text progress bar on stderr.

    On a terminal the bar is redrawn in place; otherwise (a CI log, a pipe) one line is written
    per stage, so logs stay readable. Work is counted in units (e.g. one per profiled step).
    Under a launcher of several ranks only rank 0 draws it (the others' bars would interleave).
    """

    width = 28

    def __init__(self, total: int, stream: TextIO | None = None, started: float | None = None) -> None:
        """``started``: the ``time.perf_counter()`` the work began at (default now), so the bar's
        clock counts work done before the bar could be sized."""
        self.total = max(1, int(total))
        self.done = 0
        self.text = ""
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter() if started is None else started
        self._drawn = 0
        self.shown = this_rank() == 0

    def _line(self) -> str:
        frac = min(1.0, self.done / self.total)
        fill = int(round(frac * self.width))
        bar = "#" * fill + "." * (self.width - fill)
        return f"[{bar}] {frac:4.0%} {time.perf_counter() - self.t0:6.1f}s  {self.text}"

    def _draw(self, newline: bool = False) -> None:
        if not self.shown:
            return
        line = self._line()
        if self.tty:
            # pad over the previous, possibly longer, line instead of relying on terminal codes
            pad = max(0, self._drawn - len(line))
            self.stream.write("\r" + line + " " * pad + ("\n" if newline else ""))
            self._drawn = 0 if newline else len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def stage(self, text: str) -> None:
        """Start a new stage of work, shown beside the bar."""
        self.text = text
        self._draw()

    def advance(self, n: int = 1, text: str | None = None) -> None:
        """Count ``n`` units as done (redrawn only on a terminal, to keep logs short)."""
        self.done += n
        if text is not None:
            self.text = text
        if self.tty:
            self._draw()

    def steps(self, name: str) -> Callable[[int, int], None]:
        """A ``progress(done, total)`` callback for :func:`offload_lab.profile`."""
        def callback(done: int, total: int) -> None:
            self.advance(1, f"{name}: step {done}/{total}")
        return callback

    def print(self, text: str = "") -> None:
        """Print ``text`` to stdout without tearing a bar drawn on the same terminal."""
        if self.tty and self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
            self._drawn = 0
        print(text, flush=True)
        if self.tty:
            self._draw()

    def close(self, text: str = "done") -> None:
        """Fill the bar and end its line."""
        self.done = self.total
        self.text = text
        self._draw(newline=True)
