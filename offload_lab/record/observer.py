"""Observer mode: record a per-layer timeline of a model that *another* system offloads.

Accelerate's hooks, diffusers group offloading, a serving engine's layerwise offload or
offload-lab's own manager move the weights; :func:`observe` only watches. It adds forward
hooks and timing markers and changes nothing else: no parameter, buffer, device or output is
touched, and every hook is removed on exit (normally, on error, on Ctrl-C).

>>> import torch, offload_lab
>>> from offload_lab import synthetic
>>> model = synthetic.build(offload_lab.catalog.load("wan2.1-t2v-1.3b"), scale=0.04, layers=2,
...                         dtype=torch.float32)
>>> inputs = synthetic.example_inputs(model, tokens=32)
>>> with offload_lab.observe(model, backend="cpu") as obs, torch.no_grad():
...     with obs.step():
...         _ = model(**inputs)
>>> obs.run.layers["tier"].tolist(), obs.run.backend
(['resident', 'resident'], 'observe')

How it sees
-----------
Each layer (one block of a layer group) gets five probes:

- ``P0`` a forward pre-hook registered with ``prepend=True``: it runs *before* every other
  pre-hook of the block (the layer is ready to run);
- ``P1`` a forward pre-hook appended last: it runs *after* the other system's pre-hooks, so
  ``P0 → P1`` is that system's on-entry work;
- ``Pc`` a pre-hook on every submodule of the block, of which only the first to fire in a
  forward counts: systems that wrap ``block.forward`` (accelerate's ``add_hook_to_module``,
  diffusers' ``HookRegistry``) do their on-entry work inside ``forward``, i.e. in ``P1 → Pc``;
- ``P2`` a forward hook with ``prepend=True, always_call=True`` (compute has ended);
- ``P3`` a forward hook appended last, ``always_call=True`` (after the other system's
  post-hooks: releases, prefetches issued on exit).

Hooks that another system registers *after* the observer entered are moved behind ``P1`` /
``P3`` again at each :meth:`Observer.step`, so their work never counts as compute.

At every probe of layer ``i`` the observer takes a marker (a timing event on the *current*
CUDA stream, or ``perf_counter`` on the CPU), then snapshots ``(device, data_ptr, numel,
storage)`` of every parameter of layer ``i``, as its modules hold them at that moment, and of
the next :data:`LOOKAHEAD` layers of its group (wrapping),
and of every layer at step boundaries. A change since that layer's previous snapshot is how
the other system's copies become visible.

Attribution rules
-----------------
- **Ownership.** A parameter belongs to the first layer (in group order) that holds it; copies
  are attributed to the layer whose parameters changed, never to the layer that happened to be
  running (a prefetch of ``blocks.5`` issued in ``blocks.4``'s hook is ``blocks.5``'s copy).
- **A copy** is a parameter that now holds its full-size data on the compute device and held
  something else at the previous snapshot. On CUDA a ``cpu → cuda`` change is a copy; a
  ``cuda → cuda`` change of a full-size tensor is a rebind, not a copy; a change from a
  placeholder, a ``meta`` tensor or any tensor of another size is a copy whose source we did
  not see. On the CPU backend host and device are the same memory: a change *back* to a pointer
  the parameter held before its last copy (its host copy) is a release, any other change to a
  full-size tensor is a copy. One ``copy`` row per layer, tier and detection; ``bytes`` = the
  bytes of the parameters that arrived.
- **Tier** of a copy comes from its source, i.e. the parameter's previous state: a full-size
  CPU tensor that ``is_pinned()`` → ``pinned``, in a file mapping (:func:`hostmem.file_backed_checker`)
  → ``mapped``, else ``pageable``. A source we did not see (placeholder, ``meta``, another
  device) → ``unknown``. Never guessed. (The process's file mappings are read at each step
  start, outside the step's clock: a file first mapped in the middle of a step is recognised
  from the next step on.)
- **When.** A copy row spans the layer's previous snapshot to the snapshot that saw the change
  (on the compute stream's clock on CUDA). For a synchronous copy in the other system's hook
  that is the copy; for an asynchronous prefetch it is the part not hidden from the compute
  stream (so its GB/s is an upper bound); copies seen in the same span share it. A copy is
  labelled with the step of the layer's next use, like the runtime's copies.
- **host_block** rows (stream ``host``) are recorded where the copy must have blocked the host
  thread: every copy on the CPU backend (the CPU copies its own memory), and on CUDA copies
  from ``pageable`` or ``mapped`` memory (CUDA stages them, the host waits). Pinned and unknown
  sources on CUDA get none: that cannot be known from hooks.
- **compute** is ``P1 → P2``, or ``Pc → P2`` when a copy was seen in ``P1 → Pc`` (a
  forward-wrapping system copied inside ``forward``). The other system's post-hook work (its
  release) falls after ``P2``; a forward-wrapper's release falls inside ``forward`` (before
  ``P2``), since no hook can see past it.
- **wait** (stall) rows cover ``P0 → compute start`` when the layer's *own* weights arrived in
  that span: the layer was ready to run and waited for them.
- **Placement** per layer: the tier carrying most of its copied bytes (ties go to the slower
  tier; layers with several tiers are listed in ``meta["mixed_tier_layers"]``), ``streamed`` if
  any copy was seen; a layer never copied is ``resident`` only if all its parameters were
  full-size on the compute device at every snapshot and it ran at least once, else ``unknown``. ``pin_rank`` is <NA>,
  ``reason`` is ``"observed"``.

Every snapshot reads a layer's tensors from its modules as they are *now*
(``module._parameters``), not objects captured on entry: accelerate's hooks replace the
``nn.Parameter`` objects at each load. A change is seen by pointer, size and storage (a weak
reference: a new buffer that lands at the address of a freed one is still a change). Inside a
block, every submodule wrapped by accelerate's ``add_hook_to_module`` is probed between its
``pre_forward`` and its own forward (``cpu_offload``, ``dispatch_model`` hooks load each leaf
there and drop it on exit): those loads are copies of that layer, their source tier read from
the hook's map of offloaded weights (``pageable``/``pinned``/``mapped`` for tensors held in
memory, ``mapped`` for an offload folder's files). On the CPU clock a full-size rebind seen in a
layer's own post-hooks, after it ran, is an offload (diffusers' disk groups rebind to
``empty_like`` buffers), not a copy.

What it cannot see: copies that change no parameter pointer (a system copying into buffers it
binds later shows the bind, not the copy), loads done by plain torch hooks on leaf modules
(their copies fall inside compute; a run with computes and no copy while weights changed device
says so in an :class:`ObserveWarning`), and the other system's copy stream timeline on CUDA
(use :func:`offload_lab.from_torch_profiler` for that).

On CUDA, :meth:`Observer.step` synchronizes the device at step boundaries (as offload-lab's own
runs do, so the two compare fairly); nothing else synchronizes.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pandas as pd
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from offload_lab import vocabulary
from offload_lab.errors import OffloadLabError
from offload_lab.model.spec import find_layer_groups
from offload_lab.planning.hostmem import file_backed_checker
from offload_lab.record.probes import LayerUse, Probe, WatchedLayer
from offload_lab.record.recorder import Recorder, RecordWarning, resolve_device
from offload_lab.record.runtime.backends import CpuBackend, CudaBackend
from offload_lab.record.tiers import tier_summary

__all__ = ["observe", "Observer", "ObserveError", "ObserveWarning", "LOOKAHEAD", "BACKENDS"]

BACKENDS = vocabulary.BACKENDS
#: how many layers after the running one are snapshotted at each of its probes, so that a
#: prefetch issued in layer i's hooks is seen (and timed) where it happens, not at its use
LOOKAHEAD = 2
# a slower tier wins a tie: a mix never looks better than it was
_TIER_RANK = {"mapped": 3, "pageable": 2, "unknown": 1, "pinned": 0}
_OBSERVED: weakref.WeakSet = weakref.WeakSet()
_META = torch.device("meta")


class ObserveWarning(RecordWarning):
    """A recording that missed what the observed system did (say so rather than show nothing)."""


class ObserveError(OffloadLabError, ValueError):
    """A model, group list or backend that the observer cannot work with."""


class Observer(Recorder):
    """Records a per-layer timeline of a model offloaded by someone else; changes nothing.

    Made by :func:`observe`; a context manager. Use :meth:`step` around each step (e.g. one
    denoising step: every forward inside it) and read :attr:`run` (or :meth:`build_run`) after.

    >>> import torch, offload_lab
    >>> from offload_lab import synthetic
    >>> model = synthetic.build(offload_lab.catalog.load("wan2.1-t2v-1.3b"), scale=0.04, layers=2,
    ...                         dtype=torch.float32)
    >>> x = synthetic.example_inputs(model, tokens=32)
    >>> with offload_lab.observe(model, backend="cpu", label="nobody offloads") as obs:
    ...     for _ in range(2):
    ...         with obs.step(), torch.no_grad():
    ...             _ = model(**x)
    >>> run = obs.build_run(warmup=1)
    >>> len(run.steps), run.meta["observed_system"], int(run.steps["bytes_moved"].sum())
    (1, 'nobody offloads', 0)
    """

    _error = ObserveError
    _context = "observe(...)"

    def __init__(self, model: nn.Module, groups: list[str] | None = None, backend: str = "auto",
                 label: str | None = None, device: torch.device | str | None = None,
                 scheduler: Any = "auto"):
        if not isinstance(model, nn.Module):
            raise ObserveError(f"observe expects a torch.nn.Module, got {type(model).__name__}")
        if label is not None and not isinstance(label, str):
            raise ObserveError(f"label {label!r} must be a string naming the observed system "
                               f"(e.g. 'accelerate hooks') or None")
        backend, device = resolve_device(backend, device, BACKENDS, ObserveError)
        super().__init__()
        self.model, self.device, self.clock, self.label = model, device, backend, label
        self._scheduler_target = scheduler
        self._layers = self._find_layers(model, groups)
        self._by_group: dict[str, list[WatchedLayer]] = {}
        for lay in self._layers:
            self._by_group.setdefault(lay.group, []).append(lay)
        self._hooks: list = []
        # (submodule, the inner forward we wrapped): accelerate-style leaf hooks, undone on exit
        self._inner: list[tuple[nn.Module, Any]] = []
        self._order: list[tuple[nn.Module, Any, Any, Any, Any]] = []
        self._uses: list[tuple[WatchedLayer, LayerUse]] = []
        self._overhead = 0.0
        self._checker = None
        self._tier_cache: dict[tuple[int, int], str] = {}
        self._used = False
        self._pinned_seen: dict[int, int] = {}

    # -- the layers ------------------------------------------------------------------------------
    @staticmethod
    def _find_layers(model: nn.Module, groups: list[str] | None) -> list[WatchedLayer]:
        mods = dict(model.named_modules())
        if groups is None:
            groups = find_layer_groups(model)
            if not groups:
                raise ObserveError(
                    f"{type(model).__name__!r} has no layer group (an nn.ModuleList of ≥ 2 blocks of one "
                    f"class); pass groups=[...] naming its block lists")
        else:
            if isinstance(groups, str):
                groups = [groups]
            groups = list(groups)
            for g in groups:
                if not isinstance(mods.get(g), nn.ModuleList):
                    raise ObserveError(
                        f"group {g!r} is not an nn.ModuleList of {type(model).__name__!r}; accepted: its "
                        f"block lists, detected: {find_layer_groups(model)}")
        layers, owner = [], set()
        for g in groups:
            for i, block in enumerate(mods[g]):
                slots = []
                for sub in block.modules():
                    for name, p in sub._parameters.items():
                        # a shared parameter belongs to its first owner: one copy, one layer
                        if p is not None and id(p) not in owner:
                            owner.add(id(p))
                            slots.append((sub, name))
                layers.append(WatchedLayer(g, i, block, slots))
        return layers

    # -- enter / exit ----------------------------------------------------------------------------
    def __enter__(self) -> Observer:
        return super().__enter__()

    def _claim(self) -> None:
        if self._used:
            raise ObserveError("an observer records one session; call observe(...) again for another")
        if self.model in _OBSERVED:
            raise ObserveError("this model is already being observed; leave that observer first")
        self._used = True
        _OBSERVED.add(self.model)

    def _start(self) -> None:
        if self.clock == "cuda":
            prev = torch.cuda.current_device()
            try:
                self._backend = CudaBackend(self.device)
            finally:
                torch.cuda.set_device(prev)  # the backend sets the current device; put it back
        else:
            self._backend = CpuBackend(self.device)
        self._refresh_host_view()
        for lay in self._layers:
            params = lay.tensors()
            lay.state = [self._param_state(p) for p in params]
            lay.max_bytes = [self._nbytes(p) for p in params]
            # cpu clock: where each parameter points now is its host copy (a change back is a release)
            lay.home = [{s[1]: s[4]} if s[0].type == "cpu" and s[2] else {} for s in lay.state]
            on_dev = [self._full_on_device(s, m) for s, m in zip(lay.state, lay.max_bytes)]
            lay.on_device_throughout = all(on_dev)
            lay.dev_bytes = sum(m for m, ok in zip(lay.max_bytes, on_dev) if ok)
        model_name = str(getattr(self.model, "offload_spec_meta", {}).get("spec_name")
                         or type(self.model).__name__)
        self._meta = {
            **self._base_meta("observe", self.device, model_name),
            "clock": self.clock,
            "groups": list(self._by_group),
            "lookahead": LOOKAHEAD,
        }
        if self.label is not None:
            self._meta["observed_system"] = self.label
        self._install()

    def _restore_actions(self) -> list[Callable[[], None]]:
        """Remove every hook; leave the model exactly as the other system has it."""
        def unhook() -> None:
            while self._hooks:
                self._hooks[-1].remove()
                self._hooks.pop()
            self._order.clear()
            while self._inner:
                sub, inner = self._inner[-1]
                sub._old_forward = inner
                self._inner.pop()

        def forget() -> None:
            for lay in self._layers:
                lay.open.clear()
            if self._entered:
                _OBSERVED.discard(self.model)
                self._entered = False

        return [unhook, forget]

    # -- snapshots -------------------------------------------------------------------------------
    @staticmethod
    def _nbytes(p: torch.Tensor | None) -> int:
        return 0 if p is None else int(p.numel()) * int(p.element_size())

    def _param_state(self, p: torch.Tensor | None) -> tuple:
        """``(device, data_ptr, numel, source tier, storage weak ref, element size)`` of ``p``.

        The weak reference tells a new buffer from the old one when it lands at the old
        address; it keeps no bytes alive.
        """
        if p is None:
            return (_META, 0, 0, None, None, 1)
        dev = p.device
        n = int(p.numel())
        if dev.type == "meta":
            return (dev, 0, n, None, None, int(p.element_size()))
        ref = StorageWeakRef(p.untyped_storage()) if n else None
        return (dev, int(p.data_ptr()), n, self._source_tier(p) if dev.type == "cpu" and n else None, ref,
                int(p.element_size()))

    @staticmethod
    def _same(p: torch.Tensor | None, old: tuple) -> bool:
        # the hot path: a data pointer names its device too (meta tensors have none: 0); a
        # pointer seen again after its storage died is another buffer at a reused address
        if p is None:
            return old[2] == 0
        if p.numel() != old[2]:
            return False
        if p.device.type == "meta":
            return old[0].type == "meta"
        if not old[2]:  # an empty tensor holds no bytes: only its device can change
            return p.device == old[0]
        return p.data_ptr() == old[1] and old[4] is not None and not old[4].expired()

    def _hidden_source(self, lay: WatchedLayer, k: int) -> str | None:
        """The tier a tensor that arrived from an unseen state (``meta``) was read from, where the
        system that loaded it says so (accelerate's hooks keep a map of the offloaded weights)."""
        sub, name = lay.slots[k]
        hook = getattr(sub, "_hf_hook", None)
        for h in [*getattr(hook, "hooks", ()), hook]:
            wm = getattr(h, "weights_map", None)
            if wm is None:
                continue
            data, key = wm, name
            while hasattr(data, "dataset") and hasattr(data, "prefix"):  # PrefixedDataset, nested or not
                data, key = data.dataset, f"{data.prefix}{key}"
            held = getattr(data, "state_dict", data)
            try:
                if isinstance(held, dict) and key in held:
                    t = held[key]
                    if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel():
                        return self._source_tier(t)
                # not in memory: read from the offload folder's files at each load
                if key in getattr(data, "index", {}):
                    return "mapped"
            except (TypeError, KeyError, RuntimeError):  # a map of another shape: not guessed
                return None
        return None

    def _source_tier(self, t: torch.Tensor) -> str:
        """Where a CPU tensor's bytes live; what a copy out of it would be."""
        key = (int(t.data_ptr()), self._nbytes(t))
        tier = self._tier_cache.get(key)
        if tier is None:
            try:
                pinned = t.is_pinned()
            except RuntimeError:  # torch without an accelerator cannot pin: nothing is pinned
                pinned = False
            tier = "pinned" if pinned else "mapped" if self._checker(t) else "pageable"
            self._tier_cache[key] = tier
        return tier

    def _refresh_host_view(self) -> None:
        # reading /proc/self/maps costs milliseconds: once per step, before its clock starts
        self._checker = file_backed_checker()
        self._tier_cache.clear()

    def _full_on_device(self, s: tuple, full: int) -> bool:
        dev, _, n = s[0], s[1], s[2]
        return (dev.type == self.device.type and (dev.index or 0) == (self.device.index or 0)
                and n * s[5] == full and n > 0)

    def _check(self, lay: WatchedLayer, probe: Probe, use: LayerUse | None, after_use: bool = False) -> list[dict]:
        """Snapshot ``lay`` (its tensors as the module holds them now); record what arrived."""
        arrived: dict[str, int] = {}
        changed = False
        for k, p in enumerate(lay.tensors()):
            old = lay.state[k]
            if self._same(p, old):
                continue
            changed = True
            new = self._param_state(p)
            lay.state[k] = new
            nb = self._nbytes(p)
            lay.max_bytes[k] = max(lay.max_bytes[k], nb)
            if old[0].type != new[0].type or old[2] != new[2]:
                lay.moved = True
            full = self._full_on_device(new, lay.max_bytes[k])
            if not full:
                lay.on_device_throughout = False
                continue
            src_tier = old[3] if (old[0].type == "cpu" and old[2] == new[2]) else None
            if self.clock == "cuda":
                if old[0] == new[0] and old[2] == new[2]:
                    continue  # a full-size rebind on the device: no bytes crossed the link
            else:
                home = lay.home[k].get(new[1])
                if home is not None and not home.expired():
                    continue  # back to its (still living) host copy: a release
                if after_use:
                    # rebound in its own post-hooks, once it ran: an offload into a fresh
                    # full-size buffer (diffusers' disk groups use ``empty_like``), not a load
                    continue
                if src_tier is not None:
                    lay.home[k][old[1]] = old[4]
            if src_tier is None and old[0].type == "meta":
                src_tier = self._hidden_source(lay, k)
            tier = src_tier or "unknown"
            arrived[tier] = arrived.get(tier, 0) + nb
            if tier == "pinned":
                self._pinned_seen[id(p)] = nb
        if changed:
            lay.dev_bytes = sum(m for s, m in zip(lay.state, lay.max_bytes) if self._full_on_device(s, m))
        out = []
        prev = lay.last or probe
        for tier, nb in arrived.items():
            blocking = self.clock == "cpu" or tier in ("pageable", "mapped")
            out.append({"tier": tier, "bytes": nb, "start": prev.exit, "end": probe.enter,
                        "host": (prev.host_exit, probe.host_enter) if blocking else None})
        lay.last = probe
        if out:
            if use is not None:
                use.copies.extend(out)
            else:
                lay.pending.extend(out)
        return out

    # -- probes ------------------------------------------------------------------------------------
    def _mark(self) -> Any:
        if self.clock == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            return ev
        return self._backend.now()

    def _host(self) -> float:
        return self._backend.host_to_device_time(self._backend.now())

    def _probe(self, lay: WatchedLayer | None, use: LayerUse | None, sample: bool = False,
               lookahead: bool = True, after_use: bool = False) -> tuple[Probe, bool, bool]:
        """Mark, snapshot ``lay`` and its lookahead (or every layer), mark again.

        Returns the probe, whether ``lay``'s own weights arrived and whether anything arrived.
        """
        h0 = self._host()
        m0 = self._mark()
        probe = Probe(m0, None, h0, h0)
        own = anything = False
        if lay is None:
            for other in self._layers:
                anything |= bool(self._check(other, probe, None))
        else:
            own = bool(self._check(lay, probe, use, after_use=after_use))
            anything = own
            group = self._by_group[lay.group]
            n = len(group)
            for d in range(1, (min(LOOKAHEAD, n - 1) if lookahead else 0) + 1):
                anything |= bool(self._check(group[(lay.index + d) % n], probe, None))
        if sample:
            self._sample_memory()
        probe.host_exit = self._host()
        probe.exit = self._mark()
        self._overhead += probe.host_exit - h0
        return probe, own, anything

    # -- hooks -------------------------------------------------------------------------------------
    def _install(self) -> None:
        for lay in self._layers:
            p0, p1, pc, p2, p3 = self._make_hooks(lay)
            m = lay.module
            h0 = m.register_forward_pre_hook(p0, prepend=True)
            h1 = m.register_forward_pre_hook(p1)
            h2 = m.register_forward_hook(p2, prepend=True, always_call=True)
            h3 = m.register_forward_hook(p3, always_call=True)
            self._hooks += [h0, h1, h2, h3]
            self._order.append((m, h0, h1, h2, h3))
            for sub in m.modules():
                if sub is not m:
                    self._hooks.append(sub.register_forward_pre_hook(pc))
                self._wrap_inner(lay, sub)

    def _wrap_inner(self, lay: WatchedLayer, sub: nn.Module) -> None:
        """Probe inside a forward wrapper that loads a submodule's weights and drops them again
        before any hook of ours runs (accelerate's ``add_hook_to_module`` calls
        ``module._old_forward`` between its ``pre_forward`` and ``post_forward``)."""
        inner = vars(sub).get("_old_forward")
        if "forward" not in vars(sub) or not callable(inner) or getattr(sub, "_hf_hook", None) is None:
            return

        def probed(*args, **kwargs):
            if lay.open:
                use = lay.open[-1]
                _, own, _ = self._probe(lay, use, lookahead=False)
                use.copied_in_forward |= own
            return inner(*args, **kwargs)

        sub._old_forward = probed
        self._inner.append((sub, inner))

    def _keep_order(self) -> None:
        """Put P0/P2 first and P1/P3 last again, behind hooks registered after we entered."""
        for m, h0, h1, h2, h3 in self._order:
            for hooks, first, last in ((m._forward_pre_hooks, h0, h1), (m._forward_hooks, h2, h3)):
                try:
                    hooks.move_to_end(first.id, last=False)
                    hooks.move_to_end(last.id)
                except (AttributeError, KeyError):  # a torch without ordered hook dicts: keep as is
                    pass

    def _make_hooks(self, lay: WatchedLayer):
        def p0(module, args):
            probe, _, _ = self._probe(lay, None)
            use = LayerUse(self._stamp(), probe)
            lay.open.append(use)

        def p1(module, args):
            if not lay.open:
                return
            use = lay.open[-1]
            use.p1, own, _ = self._probe(lay, use)
            use.copied_at_entry |= own
            use.child_armed = True

        def pc(module, args):
            if not lay.open or not lay.open[-1].child_armed:
                return
            use = lay.open[-1]
            use.child_armed = False
            use.pc, own, anything = self._probe(lay, use)
            use.copied_at_entry |= own
            use.copied_in_forward = anything

        def p2(module, args, *rest):
            if not lay.open:
                return
            use = lay.open[-1]
            use.child_armed = False
            use.end = self._mark()
            # copies seen for this layer since its last use belong to this use
            use.copies = lay.pending + use.copies
            lay.pending = []

        def p3(module, args, *rest):
            if not lay.open:
                return
            use = lay.open.pop()
            if use.p1 is not None and use.end is not None:
                self._uses.append((lay, use))
                lay.uses += 1
            self._probe(lay, None, sample=True, after_use=True)

        return p0, p1, pc, p2, p3

    # -- steps -------------------------------------------------------------------------------------
    @contextmanager
    def step(self) -> Iterator[Observer]:
        """Mark one step (every forward inside it); nests nowhere.

        >>> import torch, offload_lab
        >>> from offload_lab import synthetic
        >>> m = synthetic.build(offload_lab.catalog.load("wan2.1-t2v-1.3b"), scale=0.04, layers=2)
        >>> with offload_lab.observe(m, backend="cpu") as obs, obs.step(), torch.no_grad():
        ...     _ = m(**synthetic.example_inputs(m, tokens=32))
        >>> int(obs.run.events["kind"].eq("compute").sum())
        2
        """
        with super().step() as s:
            yield s

    def _before_step(self) -> None:
        self._keep_order()
        self._refresh_host_view()

    def _step_opened(self) -> None:
        self._probe(None, None)

    def _step_closing(self) -> None:
        self._probe(None, None)

    # -- memory --------------------------------------------------------------------------------------
    def _device_bytes(self) -> int:
        if self.clock == "cuda":
            return torch.cuda.memory_allocated(self.device)
        # the CPU is the device: count the layer weights that are bound there now
        return sum(lay.dev_bytes for lay in self._layers)

    def _pinned_bytes(self) -> int:
        # what we saw the other system copy from pinned memory: a lower bound of its pins
        return sum(self._pinned_seen.values())

    # -- the Run -------------------------------------------------------------------------------------
    def _layer_tiers(self) -> tuple[pd.DataFrame, list[str]]:
        rows, mixed = [], []
        for lay in self._layers:
            tb = lay.tier_bytes
            if tb:
                tier = max(tb, key=lambda t: (tb[t], _TIER_RANK.get(t, 1)))
                if len(tb) > 1:
                    mixed.append(lay.name)
                mapped = lay.max_mapped
            else:
                # a layer that never ran may hold placeholders we cannot tell from weights
                tier = "resident" if lay.on_device_throughout and lay.uses else "unknown"
                mapped = sum(lay.max_bytes[k] for k, s in enumerate(lay.state) if s[3] == "mapped") \
                    if tier == "resident" else 0
            rows.append({"group": lay.group, "layer": lay.index, "tier": tier,
                         "bytes": int(sum(lay.max_bytes)), "mapped_bytes": int(mapped),
                         "streamed": bool(tb), "pin_rank": pd.NA, "reason": "observed"})
        df = pd.DataFrame(rows, columns=["group", "layer", "tier", "bytes", "mapped_bytes", "streamed",
                                         "pin_rank", "reason"])
        return df.astype({"group": "string", "layer": "int64", "tier": "string", "bytes": "int64",
                          "mapped_bytes": "int64", "streamed": "bool", "pin_rank": "Int64",
                          "reason": "string"}), mixed

    def _events(self, r: Callable[[Any], float], warmup: int) -> list[dict]:
        for lay in self._layers:
            lay.tier_bytes, lay.max_mapped = {}, 0
        events: list[dict] = []
        kept = self._kept_steps
        for lay, use in self._uses:
            where = self._locate(use.step)
            if where is None:  # a block run by hand outside any call or step
                continue
            entry = use.pc if (use.copied_in_forward and use.pc is not None) else use.p1
            start, end = r(entry.exit), r(use.end)
            base = {"run": self._meta["run"], "step": where[0], "call": where[1], "group": lay.group,
                    "layer": lay.index}
            mapped = 0
            for c in use.copies:
                events.append({**base, "kind": "copy", "stream": "copy", "tier": c["tier"],
                               "bytes": c["bytes"], "start_s": r(c["start"]), "end_s": r(c["end"])})
                if c["host"] is not None:
                    events.append({**base, "kind": "host_block", "stream": "host", "tier": c["tier"],
                                   "bytes": c["bytes"], "start_s": c["host"][0], "end_s": c["host"][1]})
                # placement is judged on the steps the run keeps (no warm-up first copies)
                if where[0] in kept or not kept:
                    lay.tier_bytes[c["tier"]] = lay.tier_bytes.get(c["tier"], 0) + c["bytes"]
                    mapped += c["bytes"] if c["tier"] == "mapped" else 0
            lay.max_mapped = max(lay.max_mapped, mapped)
            if use.copied_at_entry:
                # ready at P0; the weights were there when the other system's hooks returned
                w0, w1 = r(use.p0.exit), r(entry.enter)
                if w1 > w0:
                    events.append({**base, "kind": "wait", "stream": "compute", "tier": "", "bytes": 0,
                                   "start_s": w0, "end_s": w1})
            events.append({**base, "kind": "compute", "stream": "compute", "tier": "", "bytes": 0,
                           "start_s": start, "end_s": end})
        return events

    def _placement(self) -> tuple[pd.DataFrame, dict[str, Any]]:
        plan_layers, mixed = self._layer_tiers()
        computes = sum(1 for _, use in self._uses if self._locate(use.step) is not None)
        copies = sum(len(use.copies) for _, use in self._uses)
        moved = [lay.name for lay in self._layers if lay.moved]
        if computes and not copies and moved:
            warnings.warn(
                f"observed {computes} layer computes but no copy, although the weights of "
                f"{len(moved)} layer(s) ({', '.join(moved[:3])}{', ...' if len(moved) > 3 else ''}) changed "
                f"device: the offloading system moves them where no hook of the observer runs; "
                f"their tier stays 'unknown'", ObserveWarning, stacklevel=3)
        return plan_layers, {
            "mixed_tier_layers": mixed,
            "unused_copies": int(sum(len(lay.pending) for lay in self._layers)),
            "observer_overhead_s": float(self._overhead),
            "label": self.label or f"observed: {tier_summary(plan_layers)}",
        }

    def _finish_events(self, events: list[dict], plan_layers: pd.DataFrame) -> None:
        # compute and wait rows take the tier the layer's placement settled on
        tier_of = {(g, int(i)): t for g, i, t in zip(plan_layers["group"], plan_layers["layer"],
                                                      plan_layers["tier"])}
        for e in events:
            if e["tier"] == "":
                e["tier"] = tier_of[(e["group"], e["layer"])]


def observe(model: nn.Module, groups: list[str] | None = None, backend: str = "auto",
            label: str | None = None, device: torch.device | str | None = None,
            scheduler: Any = "auto") -> Observer:
    """Watch ``model`` as another system offloads it; a context manager yielding an :class:`Observer`.

    ``groups`` names the block lists (default: auto-detected, as :func:`offload_lab.spec_of`);
    ``backend`` picks the clock (``"cuda"``: timing events on the current stream; ``"cpu"``:
    ``perf_counter``; ``"auto"``: cuda when a GPU is there); ``label`` names the observed system
    (``meta["observed_system"]``, and the run's label). The Run has ``backend == "observe"``.
    Every top-level call of ``model`` is recorded; without :meth:`Observer.step` markers the
    steps come from ``scheduler``'s ``step`` (``"auto"``: the scheduler of the diffusers pipeline
    that holds ``model``; ``None``: none), else one per call (``meta["steps_from"]``).
    See the module documentation for what is attributed how.

    >>> import torch, offload_lab
    >>> from offload_lab import synthetic
    >>> model = synthetic.build(offload_lab.catalog.load("wan2.1-t2v-1.3b"), scale=0.04, layers=2)
    >>> with offload_lab.observe(model, backend="cpu", label="my engine") as obs:
    ...     with obs.step(), torch.no_grad():
    ...         _ = model(**synthetic.example_inputs(model, tokens=32))
    >>> obs.run.label, obs.run.simulated
    ('my engine', False)
    """
    return Observer(model, groups=groups, backend=backend, label=label, device=device, scheduler=scheduler)

