"""Which layers stay on the device (residency) and in which order streamed layers are offered
pins (ordering policies); both read layer ids as ``3`` (single-group models), ``"3"`` or
``"blocks.3"``.

>>> from offload_lab import catalog
>>> spec = catalog.load("minimax-h3")
>>> sorted(resident_sets(spec, 2, "leading")["blocks"][0])
[0, 1]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from offload_lab.checks import is_int
from offload_lab.model.spec import ModelSpec
from offload_lab.planning.errors import PlanError, check_choice
from offload_lab.planning.options import ORDERS

__all__ = ["layer_id", "resident_sets", "streamed_order"]


def layer_id(item: Any, spec: ModelSpec, what: str) -> tuple[str, int]:
    """``3`` (single-group models), ``"3"`` or ``"blocks.3"`` -> (group, index).

    >>> from offload_lab import catalog
    >>> layer_id("blocks.3", catalog.load("minimax-h3"), "order")
    ('blocks', 3)
    """
    names = spec.group_names
    accepted = (f"layer ids as ints (single-group models) or names such as "
                f"'{names[-1]}.0' (groups: {names})")
    if isinstance(item, str) and item.strip().isdigit():
        item = int(item)
    if isinstance(item, bool) or not isinstance(item, (int, str)):
        raise PlanError(f"{what} entry {item!r} is not a layer id; expected {accepted}")
    if isinstance(item, int):
        if len(names) != 1:
            raise PlanError(
                f"{what} entry {item!r} is ambiguous in {spec.name!r}, which has groups {names}; "
                f"name the layer, e.g. '{names[-1]}.{item}'"
            )
        group, index = names[0], item
    else:
        group, _, idx = item.rpartition(".")
        if not group or not idx.isdigit():
            raise PlanError(f"{what} entry {item!r} is not a layer id; expected {accepted}")
        if group not in names:
            raise PlanError(f"{what} entry {item!r} names group {group!r}, not in {names}")
        index = int(idx)
    n = spec.group(group).num_layers
    if not 0 <= index < n:
        raise PlanError(
            f"{what} entry {item!r} is out of range: group {group!r} has layers 0..{n - 1}"
        )
    return group, index


# -- residency -----------------------------------------------------------------------------------
def _strided_resident(n: int, k: int) -> list[int]:
    """k of n resident with the streamed n − k spread evenly (stream j sits at ⌊(j + ½)·n/m⌋)."""
    m = n - k
    streamed = {(2 * j + 1) * n // (2 * m) for j in range(m)} if m else set()
    return [i for i in range(n) if i not in streamed]


def _count_of(value: Any, n: int, what: str) -> int | None:
    """A count or fraction for a group of n layers; None when ``value`` is not one."""
    if isinstance(value, bool):
        raise PlanError(f"{what} {value!r} is a bool; expected a count, a fraction in (0, 1] "
                        f"or layer ids")
    if isinstance(value, int):
        if value < 0:
            raise PlanError(f"{what} {value!r} is negative; expected a count 0..{n}, a fraction "
                            f"in (0, 1] or layer ids")
        return value
    if isinstance(value, float):
        if value == 0:
            return 0
        if not 0 < value <= 1:
            raise PlanError(
                f"{what} {value!r} is not a fraction in (0, 1]; write a count as an int "
                f"(0..{n}) or list layer ids"
            )
        return int(round(value * n))
    return None


def resident_sets(
    spec: ModelSpec, resident: Any, residency: str
) -> dict[str, tuple[set[int], str]]:
    """{group: (resident indices, how)} where ``how`` reads like ``"leading 35 of 50"``.

    >>> from offload_lab import catalog
    >>> resident_sets(catalog.load("minimax-h3"), 35, "strided")["blocks"][1]
    'strided 35 of 50'
    """
    out: dict[str, tuple[set[int], str]] = {g.name: (set(), "") for g in spec.groups}
    accepted = ("a count, a fraction in (0, 1], layer ids (3 or 'blocks.3'), or a dict "
                "{group: count | fraction | indices}")
    if resident is None:
        return out

    def place(n: int, k: int) -> tuple[set[int], str]:
        idx = list(range(k)) if residency == "leading" else _strided_resident(n, k)
        return set(idx), f"{residency} {k} of {n}"

    if isinstance(resident, dict):
        for group, value in resident.items():
            if group not in out:
                raise PlanError(f"resident names group {group!r}, not in {spec.group_names}")
            n = spec.group(group).num_layers
            k = _count_of(value, n, f"resident[{group!r}]")
            if k is None:
                if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                    raise PlanError(f"resident[{group!r}] {value!r} is not {accepted}")
                idx = set()
                for item in value:
                    if not is_int(item):
                        raise PlanError(
                            f"resident[{group!r}] entry {item!r} is not a layer index 0..{n - 1}"
                        )
                    if not 0 <= item < n:
                        raise PlanError(
                            f"resident[{group!r}] entry {item!r} is out of range: "
                            f"group {group!r} has layers 0..{n - 1}"
                        )
                    if item in idx:
                        raise PlanError(f"resident[{group!r}] lists layer {item} twice")
                    idx.add(item)
                out[group] = (idx, f"listed ({len(idx)} of {n})")
            elif k > n:
                raise PlanError(
                    f"resident[{group!r}] {value!r} is more than the group's {n} layers; "
                    f"expected 0..{n}"
                )
            else:
                out[group] = place(n, k)
        return out

    sizes = {g.name: g.num_layers for g in spec.groups}
    biggest = max(sizes.values())
    k = _count_of(resident, biggest, "resident")
    if k is not None:
        if isinstance(resident, float) and resident > 0:
            # a fraction applies to each group's own size
            return {g: place(n, int(round(resident * n))) for g, n in sizes.items()}
        if k > biggest:
            raise PlanError(
                f"resident {resident!r} is more than the {biggest} layers of the largest group "
                f"({', '.join(f'{g}: {n}' for g, n in sizes.items())}); expected a count 0..{biggest}"
            )
        # a count applies to each group, capped at the group's size
        return {g: place(n, min(k, n)) for g, n in sizes.items()}
    if isinstance(resident, (str, bytes)) or not isinstance(resident, Iterable):
        raise PlanError(f"resident {resident!r} is not {accepted}")
    chosen: dict[str, set[int]] = {g: set() for g in sizes}
    for item in resident:
        group, index = layer_id(item, spec, "resident")
        if index in chosen[group]:
            raise PlanError(f"resident lists layer {group}.{index} twice")
        chosen[group].add(index)
    return {g: (idx, f"listed ({len(idx)} of {sizes[g]})" if idx else "") for g, idx in chosen.items()}


# -- ordering policies ---------------------------------------------------------------------------
def _spread(m: int) -> list[int]:
    """0..m-1 in van der Corput (bit-reversal) order: 0, the middle, the quarters, ...

    A prefix of 2, 4, 8, ... positions is evenly spaced when m is a multiple of it; other
    prefixes are only nearly even: 12 of 40 are 0, 2, 5, 10, 12, 15, 20, 22, 25, 30, 32, 35.

    >>> sorted(_spread(40)[:12])
    [0, 2, 5, 10, 12, 15, 20, 22, 25, 30, 32, 35]
    """
    out: list[int] = []
    seen: set[int] = set()
    i = 0
    while len(out) < m:
        # radical inverse of i in base 2, as a fraction num / den
        num, den, x = 0, 1, i
        while x:
            num, den, x = num * 2 + (x & 1), den * 2, x >> 1
        pos = num * m // den
        if pos not in seen:
            seen.add(pos)
            out.append(pos)
        i += 1
    return out


def streamed_order(
    spec: ModelSpec, init_order: list[str], streamed: dict[str, list[int]], order: Any,
    byte_of: dict[tuple[str, int], int],
) -> list[tuple[str, int]]:
    """The order in which streamed layers are offered pins.

    >>> from offload_lab import catalog
    >>> spec = catalog.load("wan2.1-t2v-1.3b")
    >>> streamed_order(spec, ["blocks"], {"blocks": [0, 1, 2, 3]}, "strided", {})
    [('blocks', 0), ('blocks', 2), ('blocks', 1), ('blocks', 3)]
    """
    default = [(g, i) for g in init_order for i in streamed[g]]
    if isinstance(order, str):
        check_choice(order, "order", ORDERS, " or an explicit list of layer ids such as [3, 1] "
                      "or ['blocks.3']")
        if order == "execution":
            return default
        if order == "reverse":
            return [(g, i) for g in init_order for i in reversed(streamed[g])]
        if order == "largest":
            # sorted() is stable: ties keep group init order then index order
            return sorted(default, key=lambda key: -byte_of[key])
        return [(g, streamed[g][p]) for g in init_order for p in _spread(len(streamed[g]))]
    if not isinstance(order, (list, tuple)):
        raise PlanError(
            f"order {order!r} is not one of {', '.join(map(repr, ORDERS))} or a list of layer ids "
            f"such as [3, 1] or ['blocks.3']"
        )
    listed: list[tuple[str, int]] = []
    streamed_sets = {g: set(v) for g, v in streamed.items()}
    for item in order:
        key = layer_id(item, spec, "order")
        if key in listed:
            raise PlanError(f"order lists layer {key[0]}.{key[1]} twice")
        if key[1] not in streamed_sets[key[0]]:
            raise PlanError(
                f"order lists layer {key[0]}.{key[1]}, which is resident; list only streamed "
                f"layers (resident layers are granted after them, in index order)"
            )
        listed.append(key)
    taken = set(listed)
    # unlisted streamed layers follow in execution order, so a partial list is enough
    return listed + [key for key in default if key not in taken]
