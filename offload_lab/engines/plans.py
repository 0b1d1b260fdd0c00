"""Other engines' offload settings as offload-lab plans: :func:`as_plan`.

Each engine's settings become the planner's choices (tier, prefetch, residency, the issue
order), and each layer's reason says, in the engine's own terms, why it lives where it does.
What the plan cannot hold — copies the engine makes outside the layers, the host bytes its
allocator really locks — is in ``plan.params["engine"]``, with what was assumed where the
engine's behaviour is not fixed by its documentation and code.

>>> import offload_lab
>>> from offload_lab import engines
>>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
>>> p = engines.as_plan(spec, "diffusers-group", use_stream=True, host="64GiB")
>>> p.tier_counts["pinned"], p.prefetch, p.params["issue"]
(30, 1, 'before-compute')
>>> p.reason_of("blocks", 3).split(";")[0]
'pinned: diffusers group blocks_3_3, tensor.pin_memory() when the hook is applied (use_stream=True)'
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from typing import Any

from offload_lab.engines.errors import EngineError
from offload_lab.model.spec import ModelSpec
from offload_lab.planning.errors import PlanWarning
from offload_lab.planning.hostmem import HostMemory, HostMemoryError, resolve_host, rounded_size
from offload_lab.planning.options import ISSUE_ORDERS
from offload_lab.planning.planner import Plan, pinned_footprint, plan
from offload_lab.units import SizeError, format_bytes

__all__ = ["ENGINES", "DESCRIPTIONS", "names", "defaults", "as_plan", "pinned_bytes", "onloads", "engine_of"]

#: engine name -> its offload settings and their defaults (the engine's own names and defaults)
ENGINES: dict[str, dict[str, Any]] = {
    "diffusers-group": {
        "offload_type": "block_level", "num_blocks_per_group": 1, "use_stream": False,
        "record_stream": False, "low_cpu_mem_usage": False, "non_blocking": False,
        "offload_to_disk_path": None,
    },
    "diffusers-model": {"mode": "model"},
    "sglang-layerwise": {"dit_layerwise_offload": True, "dit_offload_prefetch_size": 1, "pin_cpu_memory": False},
    "offload-lab": {
        "pin_budget": None, "resident": 0, "residency": "leading", "order": "execution", "prefetch": 1,
        "tier": None, "staging": False, "issue": "after-compute",
    },
}
DESCRIPTIONS = {
    "diffusers-group": "diffusers group offloading: ModelMixin.enable_group_offload / hooks.apply_group_offloading",
    "diffusers-model": "diffusers pipeline offload: enable_model_cpu_offload (mode='model') or "
                       "enable_sequential_cpu_offload (mode='sequential', accelerate's per-leaf hooks)",
    "sglang-layerwise": "SGLang diffusion's layerwise DiT offload (--dit-layerwise-offload; FastVideo has the same options)",
    "offload-lab": "offload-lab's own runtime (offload_lab.offload), planned by offload_lab.plan",
}
_CHOICES = {"offload_type": ("block_level", "leaf_level"), "mode": ("model", "sequential")}
_BOOLS = {"use_stream", "record_stream", "low_cpu_mem_usage", "non_blocking", "dit_layerwise_offload",
          "pin_cpu_memory", "staging"}
_INTS = {"num_blocks_per_group": 1, "dit_offload_prefetch_size": 0}
#: a host so large that every layer an engine pins gets its pin; the real host is checked after
_ROOMY = 1 << 50


def names() -> list[str]:
    """The engines :func:`as_plan` models.

    >>> names()
    ['diffusers-group', 'diffusers-model', 'sglang-layerwise', 'offload-lab']
    """
    return list(ENGINES)


def _engine(engine: Any) -> str:
    if not isinstance(engine, str) or engine not in ENGINES:
        raise EngineError(f"engine {engine!r} is not one of {', '.join(ENGINES)}")
    return engine


def defaults(engine: str) -> dict[str, Any]:
    """The settings of ``engine`` and their defaults (the engine's own).

    >>> defaults("sglang-layerwise")
    {'dit_layerwise_offload': True, 'dit_offload_prefetch_size': 1, 'pin_cpu_memory': False}
    """
    return dict(ENGINES[_engine(engine)])


def _settings(engine: str, given: dict[str, Any]) -> dict[str, Any]:
    known = ENGINES[engine]
    out = dict(known)
    for key, value in given.items():
        if key not in known:
            raise EngineError(f"setting {key!r} is not one of {engine}'s: {', '.join(known)}")
        if key in _BOOLS and not isinstance(value, bool):
            raise EngineError(f"{engine} setting {key}={value!r} is not a bool; accepted: True or False")
        if key in _INTS and (isinstance(value, bool) or not isinstance(value, int) or value < _INTS[key]):
            raise EngineError(f"{engine} setting {key}={value!r} is not an int ≥ {_INTS[key]}")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise EngineError(f"{engine} setting {key}={value!r} is not one of {', '.join(_CHOICES[key])}")
        if key == "offload_to_disk_path" and value is not None and not isinstance(value, str):
            raise EngineError(f"{engine} setting offload_to_disk_path={value!r:.60} is not a path string or None")
        if key == "issue" and value not in ISSUE_ORDERS:
            raise EngineError(f"{engine} setting issue={value!r} is not one of {', '.join(ISSUE_ORDERS)}")
        out[key] = value
    return out


def _host(host: Any) -> HostMemory:
    try:
        resolved = resolve_host(host)
    except (HostMemoryError, SizeError) as e:
        raise EngineError(f"host: {e}") from None
    assert resolved is not None  # probe=True always answers
    return resolved


def _raw(spec: ModelSpec, group: str, index: int) -> list[Any]:
    return next(lay for lay in spec.group(group).layers if lay.index == index).tensors


def _raw_bytes(spec: ModelSpec, group: str, index: int) -> int:
    """Bytes the engine copies for one layer: its tensors as they are, no packing."""
    return sum(t.nbytes for t in _raw(spec, group, index))


def _pow2_tensors(spec: ModelSpec, group: str, index: int) -> int:
    """What ``tensor.pin_memory()`` of each of the layer's tensors locks: torch's caching host
    allocator rounds each block up to a power of two."""
    return sum(rounded_size(t.nbytes, "pow2") for t in _raw(spec, group, index))


def _pow2_per_dtype(spec: ModelSpec, group: str, index: int) -> int:
    """One consolidated buffer per layer and dtype, each from the caching host allocator."""
    by: dict[str, int] = defaultdict(int)
    for t in _raw(spec, group, index):
        by[t.dtype] += t.nbytes
    return sum(rounded_size(b, "pow2") for b in by.values())


# -- the engines -----------------------------------------------------------------------------------
def _groups_of(spec: ModelSpec, s: dict[str, Any]) -> list[tuple[str, str, list[int]]]:
    """diffusers' groups: ``(group id, layer group, layer indices)`` in execution order."""
    out = []
    for g in spec.groups:
        idx = [lay.index for lay in g.layers]
        if s["offload_type"] == "leaf_level":
            out += [(f"{g.name}.{i} (its leaf modules)", g.name, [i]) for i in idx]
            continue
        n = s["num_blocks_per_group"]
        for k in range(0, len(idx), n):
            part = idx[k:k + n]
            out.append((f"{g.name}_{part[0]}_{part[-1]}", g.name, part))
    return out


def _diffusers_group(spec: ModelSpec, s: dict[str, Any], host: HostMemory, kw: dict[str, Any]) -> tuple[Plan, dict]:
    if s["record_stream"] and not s["use_stream"]:
        raise EngineError("diffusers-group setting record_stream=True needs use_stream=True (diffusers refuses "
                          "it too); accepted: use_stream=True, or record_stream=False")
    notes: list[str] = []
    stream, low, disk = s["use_stream"], s["low_cpu_mem_usage"], s["offload_to_disk_path"] is not None
    block = s["offload_type"] == "block_level"
    if block and stream and s["num_blocks_per_group"] != 1:
        notes.append(f"diffusers sets num_blocks_per_group={s['num_blocks_per_group']} to 1 when use_stream=True "
                     f"(it logs a warning); planned with 1")
        s = {**s, "num_blocks_per_group": 1}
    n = s["num_blocks_per_group"] if block else 1
    if disk:
        tier, how = "mapped", "read back from its safetensors file under offload_to_disk_path at each onload"
        notes.append("offload_to_disk_path: each onload reads the group's own safetensors file; modelled as the "
                     "mapped tier (warm page cache); layers without checkpoint views fall back to pageable")
        if not any(t.mapped for g in spec.groups for lay in g.layers for t in lay.tensors):
            tier = "pageable"  # the planner's mapped tier needs checkpoint views; the copy is host-blocking either way
            notes.append("this spec marks no tensor as a checkpoint view, so the file reads are modelled as pageable copies")
    elif stream and not low:
        tier, how = "pinned", "tensor.pin_memory() when the hook is applied (use_stream=True)"
    elif stream:
        tier, how = "staged", "pinned on the fly at each onload (use_stream=True, low_cpu_mem_usage=True)"
        notes.append("low_cpu_mem_usage=True: the pinned copies made at each onload come from torch's caching host "
                     "allocator, which keeps them; assumed (prefetch + 1) groups of them are alive at once")
    else:
        tier, how = "pageable", "a plain .to(device) from pageable memory at the group's onload (use_stream=False)"
    if stream:
        prefetch, when = 1, "the previous group's first module's pre_forward onloads it on a side stream"
        notes.append("use_stream=True: the first group of each forward onloads itself (nothing precedes it in the "
                     "traced order); the simulator prefetches it across forwards, so that one copy is hidden in "
                     "the prediction but not in diffusers")
    else:
        prefetch, when = n - 1, "onloaded synchronously in its first module's pre_forward"
    # when diffusers' offload_() makes the host wait for the compute stream (read from
    # ModuleGroup._offload_to_memory / _offload_to_disk): with streams unless record_stream
    # (current_stream().synchronize()), and without streams from memory (a blocking
    # group_module.to(offload_device)); without streams to disk it only swaps in empty tensors
    syncs = (stream and not s["record_stream"]) or (not stream and not disk)
    if stream and not s["record_stream"]:
        notes.append("record_stream=False: diffusers synchronises the compute stream when each group is offloaded "
                     "(current_stream().synchronize() in its post_forward), so the host cannot queue the next block "
                     "before the device finishes this one: plan.params['sync_after'] holds each group's last "
                     "layer, where the simulator makes the host wait, and every host cost between blocks is exposed")
    elif syncs:
        notes.append("use_stream=False: each group is offloaded with a blocking group_module.to(offload_device), a "
                     "device-to-host copy of its weights that waits for the compute stream: plan.params['sync_after'] "
                     "holds each group's last layer, and the copy back is counted apart (extra_copies, priced at "
                     "the pageable rate)")
    if not block:
        notes.append("leaf_level is planned at block granularity: the copy of each block's leaves overlaps that "
                     "block (use_stream) or blocks the host leaf by leaf; the device peak is overstated by about a block")
    if not block and stream:
        prefetch = 1
    if not stream and n > 1:
        notes.append(f"num_blocks_per_group={n} without streams: the {n} blocks of a group arrive together at "
                     f"its first block; planned as prefetch {n - 1} so the device holds {n} blocks, as diffusers does")
    notes.append("the unmatched group (non-layer modules and top-level parameters) is onloaded synchronously "
                 "from pageable memory at every forward of the model and offloaded after it; offload-lab keeps "
                 "those weights on the device, so their copy is counted apart (extra_copies)")
    if tier == "pinned":
        p = plan(spec, tier="pinned", prefetch=prefetch, host=HostMemory(available=_ROOMY), **kw)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlanWarning)
            p = plan(spec, tier=tier, prefetch=prefetch, host=host, **kw)
    groups = _groups_of(spec, s)
    if stream:
        onl = [{"group": gid, "at": f"{g}.{part[0]}" if k == 0 else f"{groups[k - 1][1]}.{groups[k - 1][2][0]}",
                "layers": part, "bytes": sum(_raw_bytes(spec, g, i) for i in part),
                "stream": "side" if k else "side, waited for at once"}
               for k, (gid, g, part) in enumerate(groups)]
    else:
        onl = [{"group": gid, "at": f"{g}.{part[0]}", "layers": part,
                "bytes": sum(_raw_bytes(spec, g, i) for i in part), "stream": "default"} for gid, g, part in groups]
    gid_of = {(g, i): gid for gid, g, part in groups for i in part}
    reasons = []
    for g, i, t, r, rank in zip(p.layers["group"], p.layers["layer"], p.layers["tier"], p.layers["reason"],
                                p.layers["pin_rank"]):
        what = how if t == tier else f"{t}, not {tier}: {r.split(';')[0]}"
        if tier == "pinned":  # planned on a roomy host: its budget figures would mislead
            r = f"pin rank {int(rank)}, every group pinned whatever the host's budget"
        reasons.append(f"{t}: diffusers group {gid_of[(g, int(i))]}, {what}; {when}; planner: {r}")
    p.layers["reason"] = reasons
    if tier == "pinned":
        locked = sum(_pow2_tensors(spec, g, int(i)) for g, i in zip(p.layers["group"], p.layers["layer"]))
        _on_host(p, host, locked)
    elif stream:  # pins made at each onload, cached by the allocator
        per = max((sum(_pow2_tensors(spec, g, i) for i in part) for _, g, part in groups), default=0)
        locked = (prefetch + 1) * per
    else:
        locked = 0
    extra = [{"what": "unmatched group (non-layer weights)", "bytes": int(spec.non_layer_bytes),
              "tier": "mapped" if disk else "pageable", "per": "call"}]
    if not stream and not disk:
        extra.append({"what": "every group copied back to the host at its offload (group_module.to(offload_device))",
                      "bytes": sum(o["bytes"] for o in onl), "tier": "pageable", "per": "call"})
    if syncs:
        # the offload leader is a group's last module: the host waits there
        p.params["sync_after"] = {g: sorted(part[-1] for _, gg, part in groups if gg == g)
                                  for g in dict.fromkeys(g for _, g, _ in groups)}
    return p, {"settings": s, "notes": notes, "locked": locked, "onloads": onl, "extra": extra}


def _on_host(p: Plan, host: HostMemory, locked: int) -> None:
    """Check a plan made on a roomy host (every pin granted, as the engine makes them) against
    the real ``host``: the engine pins regardless of what the host has left, and the allocator's
    rounding (``locked`` − the exact stores) is new anonymous memory too."""
    led = p.ledger
    led.update(available=host.available, reserve=host.reserve, spendable=host.spendable,
               headroom=host.headroom, budget=host.spendable)
    net = int(led["net_anonymous_bytes"]) + max(0, locked - int(led["pinned_bytes"]))
    led["fits"] = net <= host.headroom and locked <= host.spendable
    p.host = host
    p.params["pin_budget"] = None
    if not led["fits"]:
        msg = (f"{p.spec.name}: the engine pins every layer whatever the host has, locking {format_bytes(locked)} "
               f"(net new {format_bytes(net)}); the host can spend {format_bytes(host.spendable)}: "
               f"does not fit the host")
        p.layers["reason"] = [f"{r}; does not fit the host" for r in p.layers["reason"]]
        p.warnings.append(msg)
        warnings.warn(msg, PlanWarning, stacklevel=4)


def _diffusers_model(spec: ModelSpec, s: dict[str, Any], host: HostMemory, kw: dict[str, Any]) -> tuple[Plan, dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        if s["mode"] == "model":
            p = plan(spec, resident=1.0, prefetch=0, host=host, **kw)
        else:
            p = plan(spec, tier="pageable", prefetch=0, host=host, **kw)
    if s["mode"] == "model":
        p.layers["reason"] = [f"resident: enable_model_cpu_offload moves the whole transformer to the device when "
                              f"the pipeline first uses it and back when the next component runs; planner: {r}"
                              for r in p.layers["reason"]]
        notes = ["enable_model_cpu_offload: the whole component is copied once per pipeline call (accelerate's "
                 "cpu_offload_with_hook, pageable); the extra copy is spread over the spec's default steps"]
        extra = [{"what": "the whole component, once per pipeline call", "bytes": int(spec.total_bytes),
                  "tier": "pageable", "per": "request"}]
    else:
        p.layers["reason"] = [f"pageable: enable_sequential_cpu_offload, accelerate's AlignDevicesHook on each leaf "
                              f"module copies its weights synchronously in pre_forward (new nn.Parameter objects "
                              f"through set_module_tensor_to_device) and drops them after; planner: {r}"
                              for r in p.layers["reason"]]
        ntens = sum(len(lay.tensors) for g in spec.groups for lay in g.layers)
        notes = ["enable_sequential_cpu_offload: copies are per leaf module; planned at block granularity, with "
                 "one copy latency per tensor added (extra_copies); non-layer weights are streamed too",
                 "accelerate's offloaded weights are assumed to sit in pageable memory (no pinning)"]
        extra = [{"what": "non-layer weights, every forward", "bytes": int(spec.non_layer_bytes), "tier": "pageable",
                  "per": "call"},
                 {"what": "per-tensor copy latency of leaf-level copies", "bytes": 0, "tier": "pageable",
                  "per": "call", "copies": ntens}]
    return p, {"settings": s, "notes": notes, "locked": 0, "onloads": [], "extra": extra}


def _sglang(spec: ModelSpec, s: dict[str, Any], host: HostMemory, kw: dict[str, Any]) -> tuple[Plan, dict]:
    pf = s["dit_offload_prefetch_size"]
    notes = ["the prefetch of layer i + prefetch is assumed issued from layer i's pre-forward hook, before its "
             "kernels (issue order before-compute)",
             "pin_cpu_memory is taken as off unless set (the --pin-cpu-memory flag turns it on)",
             "pinned layer buffers are assumed allocated through torch's caching host allocator: one buffer per "
             "layer and dtype, each rounded up to a power of two"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        if not s["dit_layerwise_offload"]:
            p = plan(spec, resident=1.0, prefetch=0, host=host, **kw)
            tag = "resident: dit_layerwise_offload is off, the DiT stays on the device"
        elif s["pin_cpu_memory"]:
            p = plan(spec, prefetch=pf, host=host, **kw)
            tag = "the layerwise manager's per-layer pin grant from the host's pin budget (pin_cpu_memory)"
        else:
            p = plan(spec, tier="pageable", prefetch=pf, host=host, **kw)
            tag = "pin_cpu_memory is off: the layer's consolidated CPU buffer is pageable"
    p.layers["reason"] = [f"{t}: {tag}, prefetch {pf}; planner: {r}"
                          for t, r in zip(p.layers["tier"], p.layers["reason"])]
    pinned = p.layers.loc[p.layers["pin_rank"].notna()]
    locked = sum(_pow2_per_dtype(spec, g, int(i)) for g, i in zip(pinned["group"], pinned["layer"]))
    return p, {"settings": s, "notes": notes, "locked": locked, "onloads": [], "extra": []}


def _offload_lab(spec: ModelSpec, s: dict[str, Any], host: HostMemory, kw: dict[str, Any]) -> tuple[Plan, dict]:
    args = {k: v for k, v in s.items() if k != "issue"}
    p = plan(spec, host=host, **args, **kw)
    locked = pinned_footprint(p, "exact") + int(p.ledger.get("staging_bytes") or 0)
    return p, {"settings": s, "notes": [], "locked": locked, "onloads": [], "extra": []}


_BUILDERS = {"diffusers-group": _diffusers_group, "diffusers-model": _diffusers_model,
             "sglang-layerwise": _sglang, "offload-lab": _offload_lab}
_ISSUE = {"diffusers-group": "before-compute", "diffusers-model": "before-compute",
          "sglang-layerwise": "before-compute"}


def as_plan(spec: ModelSpec, engine: str, host: Any = None, device_memory: int | str | None = None,
            tokens: int | str | None = None, **settings: Any) -> Plan:
    """The :class:`~offload_lab.Plan` that ``engine`` with ``settings`` realises for ``spec``.

    ``engine`` is one of :func:`names`; ``settings`` are the engine's own option names
    (:func:`defaults`). ``host``, ``device_memory`` and ``tokens`` are as for
    :func:`offload_lab.plan`. ``plan.params["engine"]`` holds the engine, its settings (as
    the engine applies them), ``notes`` (what was assumed), ``locked_bytes`` (host bytes the
    engine's pins really lock), ``onloads`` (diffusers: which layers each onload moves, where it
    is issued, its bytes) and ``extra_copies`` (copies outside the layers);
    ``plan.params["issue"]`` is the engine's issue order, which :func:`offload_lab.simulate` uses.
    An engine that pins regardless of the host (diffusers with ``use_stream=True``) gets every
    pin, and ``plan.fits`` says whether the host holds them.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> p = as_plan(spec, "sglang-layerwise", dit_offload_prefetch_size=2, pin_cpu_memory=True, host="64GiB")
    >>> p.prefetch, p.tier_counts["pinned"], p.params["engine"]["name"]
    (2, 40, 'sglang-layerwise')
    >>> as_plan(spec, "diffusers-group", use_streams=True)
    Traceback (most recent call last):
    ...
    offload_lab.engines.errors.EngineError: setting 'use_streams' is not one of diffusers-group's: offload_type, num_blocks_per_group, use_stream, record_stream, low_cpu_mem_usage, non_blocking, offload_to_disk_path
    """
    engine = _engine(engine)
    if not isinstance(spec, ModelSpec):
        raise EngineError(f"spec {spec!r:.80} is not a ModelSpec; accepted: catalog.load(name) or spec_of(model)")
    s = _settings(engine, settings)
    h = _host(host)
    kw = {"device_memory": device_memory, "tokens": tokens}
    p, info = _BUILDERS[engine](spec, s, h, kw)
    issue = s.get("issue") or _ISSUE[engine]
    p.params["engine"] = {
        "name": engine, "settings": info["settings"], "notes": info["notes"],
        "locked_bytes": int(info["locked"]), "onloads": info["onloads"], "extra_copies": info["extra"],
    }
    p.params["issue"] = issue
    return p


def engine_of(p: Plan) -> str | None:
    """The engine a plan was made for by :func:`as_plan` (None: an ordinary plan)."""
    info = (getattr(p, "params", None) or {}).get("engine")
    return info.get("name") if isinstance(info, dict) else None


def pinned_bytes(p: Plan) -> int:
    """Host bytes the plan's pins really lock under its engine (an ordinary plan: offload-lab's
    exact stores plus staging buffers).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> p = as_plan(spec, "diffusers-group", use_stream=True, host="64GiB")
    >>> pinned_bytes(p) > p.ledger["pinned_bytes"]   # each tensor rounded up to a power of two
    True
    """
    info = (getattr(p, "params", None) or {}).get("engine")
    if isinstance(info, dict) and "locked_bytes" in info:
        return int(info["locked_bytes"])
    return pinned_footprint(p, "exact") + int(p.ledger.get("staging_bytes") or 0)


def onloads(p: Plan) -> list[dict[str, Any]]:
    """diffusers' onloads of one forward in order: group id, the layer where it is issued
    (``at``), the layers it moves and their bytes (empty for the other engines)."""
    info = (getattr(p, "params", None) or {}).get("engine")
    return list(info.get("onloads", [])) if isinstance(info, dict) else []
