"""Device memory of a plan: the predicted device peak and whether it fits the device.

The peak is an **estimate**, the sum of four parts:

* ``non_layer``: every tensor outside the layer groups (embeddings, heads, norms), moved to the
  device once;
* ``resident``: the resident layers, at their store sizes;
* ``in_flight``: per group, the largest ``prefetch + 1`` consecutive streamed layers in
  execution order (wrapping to the next forward) — the running layer plus the copies issued
  ahead of it, at their real sizes (a group's windows differ when its layers do);
* ``activation``: ``S × (4·d + f) × b`` with ``S`` = video tokens + text tokens, ``d`` the
  model width, ``f`` the FFN's inner width (both halves of a gated FFN), ``b`` the bytes of
  the layers' dtype. It counts the block's input, output and residual stream, the attention
  projections and the FFN's hidden state, assuming a fused attention kernel (no ``S²`` score
  matrix). Allocator slack, the CUDA context and workspaces are not counted.

>>> from offload_lab import catalog
>>> spec = catalog.load("wan2.1-t2v-14b")
>>> round(activation_bytes(spec, "480p") / 2**30, 2)
2.13
>>> parse_device_memory("24GiB") == 24 * 2**30
True
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from offload_lab.checks import is_int
from offload_lab.model.flops import FlopsError, resolve_tokens
from offload_lab.model.spec import DTYPE_BYTES, ModelSpec
from offload_lab.planning.errors import PlanError, PlanSizeError
from offload_lab.units import SizeError, format_bytes, parse_size

__all__ = ["DEVICE_KEYS", "activation_bytes", "device_parts", "parse_device_memory", "in_flight_bytes"]

#: ledger keys the device model adds to a plan's ledger
DEVICE_KEYS = ("device_memory", "device_peak_bytes", "device_non_layer_bytes", "device_resident_bytes",
               "device_in_flight_bytes", "device_activation_bytes", "device_tokens", "device_fits")


def parse_device_memory(value: Any) -> int | None:
    """Bytes of device memory from an int or a size string; ``None`` stays ``None``.

    >>> parse_device_memory("nonsense")
    Traceback (most recent call last):
    ...
    offload_lab.planning.errors.PlanSizeError: device_memory = 'nonsense' is not a size; accepted: a positive size such as '24GiB', '80GB', 24e9 or an int of bytes
    """
    if value is None:
        return None
    accepted = "accepted: a positive size such as '24GiB', '80GB', 24e9 or an int of bytes"
    try:
        n = parse_size(value, "device_memory")
    except SizeError:
        raise PlanSizeError(f"device_memory = {value!r} is not a size; {accepted}") from None
    if n <= 0:
        raise PlanSizeError(f"device_memory = {value!r} is not positive; {accepted}")
    return n


def _resolve_tokens(spec: ModelSpec, tokens: int | str | None) -> int | None:
    """Video tokens per forward: an int, a resolution of ``spec.meta["tokens"]``, or the spec's
    smallest resolution when ``None`` (``None`` when the spec names none)."""
    table = spec.meta.get("tokens") or {}
    if tokens is None:
        if isinstance(table, dict) and table:
            return int(min(table.values()))
        return int(table) if is_int(table) else None
    try:
        return resolve_tokens(spec, tokens)
    except FlopsError as e:
        raise PlanError(f"tokens: {e}") from None


def _widths(spec: ModelSpec) -> tuple[int, int]:
    """``(d, f)``: model width and FFN inner width, from ``meta["dims"]`` or the weight shapes."""
    dims = spec.meta.get("dims") or {}
    if dims.get("d"):
        f = dims.get("ffn_fused") or dims.get("ffn") or 4 * dims["d"]
        return int(dims["d"]), int(f)
    shapes = [t.shape for g in spec.groups for t in (g.layers[0].tensors if g.layers else [])
              if len(t.shape) == 2]
    if not shapes:
        return 0, 0
    # the width is the most common input dimension of a block's matrices; the FFN the widest output
    d = Counter(s[1] for s in shapes).most_common(1)[0][0]
    return int(d), int(max(s[0] for s in shapes))


def activation_bytes(spec: ModelSpec, tokens: int | str | None = None) -> int:
    """Estimated activation bytes of one forward: ``S × (4·d + f) × dtype bytes`` (module doc).

    ``tokens`` defaults to the spec's smallest resolution; 0 when the spec names no tokens.

    >>> from offload_lab import catalog
    >>> round(activation_bytes(catalog.load("minimax-h3"), "720p") / 2**30, 2)
    7.11
    """
    n = _resolve_tokens(spec, tokens)
    if not n:
        return 0
    s = n + int(spec.meta.get("text_tokens", 0) or 0)
    d, f = _widths(spec)
    dtypes = Counter(t.dtype for g in spec.groups for layer in g.layers[:1] for t in layer.tensors)
    b = DTYPE_BYTES[dtypes.most_common(1)[0][0]] if dtypes else 2
    return int(s * (4 * d + f) * b)


def in_flight_bytes(streamed: list[int], prefetch: int) -> int:
    """Largest sum of ``prefetch + 1`` consecutive streamed layer sizes, wrapping around.

    >>> in_flight_bytes([1, 5, 2, 7], 1), in_flight_bytes([1, 5, 2, 7], 9), in_flight_bytes([], 2)
    (9, 15, 0)
    """
    n = len(streamed)
    w = min(prefetch + 1, n)
    if w == 0:
        return 0
    cur = sum(streamed[:w])
    best = cur
    for i in range(1, n):  # window starting at i, wrapping
        cur += streamed[(i + w - 1) % n] - streamed[i - 1]
        best = max(best, cur)
    return best


def device_parts(spec: ModelSpec, placement: Iterable[tuple[str, int, bool, int]], prefetch: int,
                 tokens: int | str | None, device_memory: int | None) -> dict[str, Any]:
    """The device part of a ledger from ``(group, layer, streamed, bytes)`` rows.

    >>> from offload_lab import catalog, plan, HostMemory
    >>> p = plan(catalog.load("wan2.1-t2v-14b"), resident=20, device_memory="24GiB",
    ...          host=HostMemory(available="64GiB"))
    >>> p.ledger["device_fits"], format_bytes(p.ledger["device_peak_bytes"])
    (True, '16.96 GiB')
    """
    rows = sorted(placement, key=lambda r: (r[0], r[1]))
    resident = sum(b for _, _, s, b in rows if not s)
    in_flight = 0
    for g in spec.group_names:
        in_flight += in_flight_bytes([b for gg, _, s, b in rows if gg == g and s], prefetch)
    act = activation_bytes(spec, tokens)
    peak = spec.non_layer_bytes + resident + in_flight + act
    return {
        "device_memory": device_memory, "device_peak_bytes": int(peak),
        "device_non_layer_bytes": int(spec.non_layer_bytes), "device_resident_bytes": int(resident),
        "device_in_flight_bytes": int(in_flight), "device_activation_bytes": int(act),
        "device_tokens": _resolve_tokens(spec, tokens),
        "device_fits": True if device_memory is None else bool(peak <= device_memory),
    }


def misfit_note(ledger: dict[str, Any], who: str = "") -> str:
    """One line saying the plan does not fit the device, with its parts."""
    return (f"{who}device peak {format_bytes(ledger['device_peak_bytes'])} (estimate: non-layer "
            f"{format_bytes(ledger['device_non_layer_bytes'])} + resident "
            f"{format_bytes(ledger['device_resident_bytes'])} + in flight "
            f"{format_bytes(ledger['device_in_flight_bytes'])} + activations "
            f"{format_bytes(ledger['device_activation_bytes'])}) exceeds device memory "
            f"{format_bytes(ledger['device_memory'])}")
