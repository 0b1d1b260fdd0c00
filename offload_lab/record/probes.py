"""What the observer keeps while it watches: probe markers, one record per layer use, layer state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn


@dataclass
class Probe:
    """Markers at the entry and exit of one probe (our own work lies between them)."""

    enter: Any
    exit: Any
    host_enter: float
    host_exit: float


@dataclass
class LayerUse:
    """One forward of one layer."""

    step: Any  # where it ran: (explicit step or None, call id or None), resolved at build
    p0: Probe
    p1: Probe | None = None
    pc: Probe | None = None
    end: Any = None
    child_armed: bool = False
    copied_at_entry: bool = False   # this layer's own weights arrived in P0 → compute start
    copied_in_forward: bool = False  # some copy was seen in P1 → Pc (a forward wrapper's work)
    copies: list[dict] = field(default_factory=list)


@dataclass
class WatchedLayer:
    group: str
    index: int
    module: nn.Module
    #: where each of its parameters lives, as ``(owning submodule, name)``: resolved at every
    #: snapshot, since other systems replace the ``nn.Parameter`` objects themselves
    slots: list[tuple[nn.Module, str]]
    state: list[tuple] = field(default_factory=list)   # (device, ptr, numel, source tier | None)
    home: list[set] = field(default_factory=list)      # cpu backend: pointers of host copies
    max_bytes: list[int] = field(default_factory=list)
    last: Probe | None = None
    on_device_throughout: bool = True
    pending: list[dict] = field(default_factory=list)
    open: list[LayerUse] = field(default_factory=list)
    tier_bytes: dict[str, int] = field(default_factory=dict)
    max_mapped: int = 0
    uses: int = 0
    dev_bytes: int = 0  # bytes of its weights bound on the compute device at the last snapshot

    moved: bool = False  # a tensor changed device or size at some snapshot (e.g. cpu ↔ meta)

    def tensors(self) -> list[Any]:
        """Its parameters as the module holds them now (None where one was removed)."""
        return [m._parameters.get(n) for m, n in self.slots]

    @property
    def name(self) -> str:
        return f"{self.group}.{self.index}"
