"""The error every engine function raises on a bad engine name or setting."""

from __future__ import annotations

from offload_lab.errors import OffloadLabError

__all__ = ["EngineError"]


class EngineError(OffloadLabError, ValueError):
    """An engine name or setting offload-lab does not know; the message names it and what is accepted."""
