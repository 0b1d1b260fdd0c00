"""The instrumented offload manager: applies a plan to a live module and records a Run."""

from __future__ import annotations

import atexit
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import nn

from offload_lab import vocabulary
from offload_lab.planning.hostmem import file_backed_checker, process_memory
from offload_lab.record.recorder import Recorder, resolve_device
from offload_lab.record.runtime.backends import ISSUE_ORDERS, CopyTicket, CpuBackend, CudaBackend
from offload_lab.record.runtime.options import (
    MAX_STAGE_THREADS,
    OffloadError,
    OffloadOptions,
    plan_label,
    resolve_options,
)
from offload_lab.record.runtime.staging import StagingPool, staging_size
from offload_lab.record.runtime.stores import LayerStore, StorageKey, exclusive_storages

if TYPE_CHECKING:
    from offload_lab.planning.planner import Plan

#: the models (and pipeline components) under a manager right now
ACTIVE: weakref.WeakSet = weakref.WeakSet()
INIT_STRATEGIES = vocabulary.INIT_STRATEGIES
MEMORY_SAMPLE_S = 0.002
BACKENDS = vocabulary.BACKENDS
__all__ = ["ACTIVE", "BACKENDS", "INIT_STRATEGIES", "ISSUE_ORDERS", "MAX_STAGE_THREADS", "MEMORY_SAMPLE_S",
           "CallGate", "LayerHooks", "OffloadError", "OffloadManager", "OffloadOptions"]
#: seconds restore waits for another thread's forward to finish before it restores anyway
GATE_WAIT_S = 60.0


class CallGate:
    """One caller at a time: a second thread's forward waits until the first one has returned.

    Streaming keeps per-group state (the copies in flight, the layer bound right now) that two
    interleaved forwards would corrupt, so calls of an offloaded model are serialized; a thread
    inside a forward may re-enter (nested roots, a component calling another).
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = threading.local()

    def enter(self, module: nn.Module | None = None, args: Any = None) -> None:
        self._lock.acquire()
        self._depth.n = getattr(self._depth, "n", 0) + 1

    def leave(self, module: nn.Module | None = None, args: Any = None, *rest: Any) -> None:
        n = getattr(self._depth, "n", 0)
        if n:  # this thread's enter went through (an interrupt may have cut it short)
            self._depth.n = n - 1
            self._lock.release()

    def release_all(self) -> None:
        """Let go of every level this thread holds: a forward cut short by an interrupt never
        runs its post-hooks (torch runs ``always_call`` hooks on an ``Exception`` only)."""
        while getattr(self._depth, "n", 0):
            self._depth.n -= 1
            self._lock.release()

    def acquire(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=timeout)

    def release(self) -> None:
        self._lock.release()


@dataclass
class _Group:
    name: str
    blocks: nn.ModuleList
    streamed: list[int]
    pos: dict[int, int] = field(default_factory=dict)
    in_flight: dict[int, CopyTicket] = field(default_factory=dict)
    live: dict[int, CopyTicket] = field(default_factory=dict)  # bound to the device right now
    # host-blocking copies deferred to the post-hook (after-compute issue order)
    pending: list[int] = field(default_factory=list)
    pool: StagingPool | None = None
    # device buffers allocated and not yet reusable, and the compute-end markers of the released
    # ones, oldest first (after-compute on cuda: see OffloadManager._throttle)
    outstanding: int = 0
    released: deque = field(default_factory=deque)


class OffloadManager(Recorder):
    """Drives one model's layer groups under a plan, recording every copy and compute interval.

    Use it through :func:`offload` (a context manager) or :func:`profile`:

    >>> import offload_lab
    >>> from offload_lab import synthetic
    >>> model = synthetic.build(offload_lab.catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=4)
    >>> inputs = synthetic.example_inputs(model, tokens=64)
    >>> plan = offload_lab.plan(offload_lab.spec_of(model), tier="pinned")
    >>> with offload_lab.offload(model, plan, backend="cpu") as m:
    ...     with m.step():
    ...         out = model(**inputs)
    >>> len(m.run.steps)
    1
    """

    _error = OffloadError
    _context = "offload(...)"
    _sample_every_s = MEMORY_SAMPLE_S

    def __init__(self, model: nn.Module, plan: Plan, backend: str = "auto", device: torch.device | str | None = None,
                 init: str = "grouped", label: str | None = None, record_memory: bool = True,
                 scheduler: Any = "auto", issue: str = "after-compute", stage_threads: int = 1,
                 options: OffloadOptions | None = None):
        if not isinstance(model, nn.Module):
            raise OffloadError(f"offload expects a torch.nn.Module, got {type(model).__name__}")
        if model in ACTIVE:
            raise OffloadError("this model is already under an offload manager; leave that one first")
        opts = resolve_options(options, backend=backend, device=device, init=init, label=label,
                               record_memory=record_memory, scheduler=scheduler, issue=issue,
                               stage_threads=stage_threads)
        backend, device = resolve_device(opts.backend, opts.device, BACKENDS, OffloadError)
        super().__init__()
        self.options = opts
        self.model, self.plan, self.device = model, plan, device
        self.backend_name, self.init_strategy = backend, opts.init
        self.label = opts.label
        self.record_memory = opts.record_memory
        self._scheduler_target = opts.scheduler
        self.issue_order, self.stage_threads = opts.issue, opts.stage_threads
        self._gate = CallGate()
        self._backward_refused = False
        self._stage_pool: Any = None  # threads sharing one staging memcpy (stage_threads > 1)
        self._groups = self._check_plan(model, plan)
        self._stores: dict[tuple[str, int], LayerStore] = {}
        self._resident_bufs: dict[tuple[str, int], dict] = {}
        self._hooks: list = []
        self._moved: list[tuple[torch.Tensor | nn.Parameter, torch.Tensor, Any, str]] = []
        self._placeholders: dict[torch.dtype, torch.Tensor] = {}
        self._records: list[dict] = []
        self._device_ledger = 0
        self._init_peak = 0
        # storages one parameter owns alone, as found: a packed store may release those
        self._exclusive: set[StorageKey] = set()

    # -- plan ↔ model ----------------------------------------------------------------------------
    @staticmethod
    def _check_plan(model: nn.Module, plan: Plan) -> list[_Group]:
        spec = plan.spec
        mods = dict(model.named_modules())
        _refuse_meta(model)
        groups = []
        for g in spec.groups:
            blocks = mods.get(g.name)
            if not isinstance(blocks, nn.ModuleList):
                raise OffloadError(
                    f"plan group {g.name!r} is not an nn.ModuleList of this model; its groups: "
                    f"{[n for n, m in mods.items() if isinstance(m, nn.ModuleList) and len(m) > 1]}")
            _refuse_containers(g.name, blocks)
            if len(blocks) != g.num_layers:
                raise OffloadError(
                    f"plan group {g.name!r} has {g.num_layers} layers but the model's has {len(blocks)}: "
                    f"the plan was made for another model (build it from spec_of(model))")
            groups.append(_Group(g.name, blocks, []))
        _refuse_shared(groups)
        for grp, g in zip(groups, spec.groups, strict=True):
            blocks = grp.blocks
            for layer in g.layers:
                nbytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in blocks[layer.index].parameters()}.values())
                if nbytes != layer.bytes:
                    raise OffloadError(
                        f"layer {layer.name} has {nbytes} bytes in the model but {layer.bytes} in the plan's "
                        f"spec {spec.name!r}: the plan was made for another model")
            pl = plan.layers[plan.layers["group"] == g.name]
            grp.streamed = [int(i) for i in pl[pl["streamed"]]["layer"].sort_values()]
            grp.pos = {i: k for k, i in enumerate(grp.streamed)}
        return groups

    def _tier(self, group: str, layer: int) -> str:
        return self.plan.tier_of(group, layer)

    def _pin_rank(self, group: str, layer: int) -> int | None:
        df = self.plan.layers
        rank = df.loc[(df["group"] == group) & (df["layer"] == layer), "pin_rank"]
        return None if rank.empty or pd.isna(rank.iloc[0]) else int(rank.iloc[0])

    # -- enter / exit --------------------------------------------------------------------------
    def __enter__(self) -> OffloadManager:
        return super().__enter__()

    def _claim(self) -> None:
        if self.model in ACTIVE:
            raise OffloadError("this model is already under an offload manager; leave that one first")
        ACTIVE.add(self.model)
        # a manager entered and never left is restored before the interpreter tears torch down
        atexit.register(self._restore_at_exit)

    def _restore_at_exit(self) -> None:
        if self._entered:
            try:
                self._restore()
            except BaseException:  # noqa: BLE001 - the process is ending: nothing to report to
                pass

    def _watch_calls(self) -> None:
        super()._watch_calls()
        # the gate is the outermost hook of each call root: a waiting thread is not yet recorded
        for mods in self._call_roots().values():
            for m in mods:
                self._call_hooks.append(m.register_forward_pre_hook(self._gate.enter, prepend=True))
                self._call_hooks.append(m.register_forward_hook(self._gate.leave, always_call=True))

    def _restore(self) -> None:
        # wait for another thread's forward in flight, so nothing is restored under it
        held = self._gate.acquire(GATE_WAIT_S)
        try:
            super()._restore()
        finally:
            if held:
                self._gate.release()
            self._gate.release_all()

    def _start(self) -> None:
        mem0 = process_memory()
        if self.backend_name == "cuda":
            self._backend = CudaBackend(self.device, issue=self.issue_order)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._cuda_base = torch.cuda.memory_allocated(self.device)
        else:
            self._backend = CpuBackend(self.device, issue=self.issue_order)
        self._init()
        self._make_staging()
        # read before prefetch is armed: on the cpu backend, device buffers are anonymous too
        stores_anon = process_memory()["anon_bytes"] - mem0["anon_bytes"]
        for g in self._groups:
            self._arm(g)
        pinned = self._pinned_bytes()
        spec = self.plan.spec
        self._meta = {
            **self._base_meta(self.backend_name, self.device, spec.name),
            "model_bytes": spec.total_bytes,
            "plan": {**self.plan.params, "ledger": self.plan.ledger, "warnings": list(self.plan.warnings)},
            # the whole plan (spec included), so a run can be re-simulated or re-planned later
            "plan_full": self.plan.to_dict(),
            "prefetch": int(self.plan.prefetch),
            "init_strategy": self.init_strategy,
            "startup_peak_bytes": int(self._init_peak),
            "predicted_startup_peak_bytes": int(self.plan.startup_peak(self.init_strategy)),
            "net_anonymous_bytes": int(stores_anon),
            "pinned_bytes": int(pinned),
            "pin_method": sorted({s.pin_method for s in self._stores.values() if s.pin_method}),
            "init": {"resident_bytes_copied": int(sum(
                self._stores[k].nbytes for k in self._resident_bufs)),
                     # originals a packed store replaced (freed, rebuilt at restore) or sits beside
                     "originals_released_bytes": int(sum(s.released_bytes for s in self._stores.values())),
                     "originals_kept_bytes": int(sum(s.kept_bytes for s in self._stores.values()))},
            "groups": [g.name for g in self._groups],
            "issue": self.issue_order,
            "stage_threads": self.stage_threads,
            "staging": {g.name: {"buffers": g.pool.count, "buffer_bytes": g.pool.nbytes,
                                 "pinned_bytes": g.pool.pinned_bytes}
                        for g in self._groups if g.pool is not None},
        }
        if self.backend_name == "cuda":
            self._meta["cuda"] = {"capability": list(torch.cuda.get_device_capability(self.device)),
                                  "total_memory": torch.cuda.get_device_properties(self.device).total_memory}
        self._meta["label"] = self.label or plan_label(self.plan.layers, self.plan.prefetch)
        self._install_hooks()
        self._sample_memory(force=True)

    def _restore_actions(self) -> list[Callable[[], None]]:
        """Put the model back exactly as it was; free pinned memory; stop copy threads.

        Each action is idempotent (restore may retry one an interrupt cut short): stores and
        moved tensors are dropped from their lists only once they are back.
        """
        def unhook() -> None:
            while self._hooks:
                self._hooks[-1].remove()
                self._hooks.pop()

        def close_backend() -> None:
            if self._backend is not None:
                # close joins every copy and stager thread (with a timeout); a thread an
                # interrupt started while close ran is joined by a second pass
                for _ in range(3):
                    self._backend.close()
                    if not self._backend.threads_alive():
                        break

        def free_staging() -> None:
            for g in self._groups:
                if g.pool is not None:
                    g.pool.close()
                    g.pool = None
                g.pending.clear()
            if self._stage_pool is not None:
                self._stage_pool.shutdown(wait=True)
                self._stage_pool = None

        def forget_copies() -> None:
            for g in self._groups:
                g.in_flight.clear()
                g.live.clear()
            self._resident_bufs.clear()

        def restore_stores() -> None:
            while self._stores:
                key = next(iter(self._stores))
                self._stores[key].restore()
                del self._stores[key]

        def restore_moved() -> None:
            while self._moved:
                t, orig, req, _ = self._moved[-1]
                t.data = orig
                if isinstance(t, nn.Parameter):
                    t.requires_grad_(req)
                self._moved.pop()
            self._placeholders.clear()

        def release() -> None:
            if self._entered:
                ACTIVE.discard(self.model)
                self._entered = False
            atexit.unregister(self._restore_at_exit)
            if self.backend_name == "cuda" and torch.cuda.is_available():
                torch.cuda.empty_cache()

        return [unhook, close_backend, free_staging, forget_copies, restore_stores, restore_moved, release]

    # -- initialisation ----------------------------------------------------------------------------
    def _layer_param_ids(self) -> set[int]:
        return {id(p) for g in self._groups for b in g.blocks for p in b.parameters()}

    def _ledger(self, delta: int) -> None:
        self._device_ledger += delta
        self._init_peak = max(self._init_peak, self._device_used())

    def _device_used(self) -> int:
        if self.backend_name == "cuda":
            return torch.cuda.max_memory_allocated(self.device) - self._cuda_base
        return self._device_ledger

    def _placeholder(self, dtype: torch.dtype) -> torch.Tensor:
        ph = self._placeholders.get(dtype)
        if ph is None:
            ph = self._placeholders[dtype] = torch.zeros(1, dtype=dtype, device=self.device)
        return ph

    def _move(self, t: torch.Tensor, kind: str) -> None:
        if t.device == self.device and self.backend_name == "cuda":
            return
        orig = t.data
        self._moved.append((t, orig, t.requires_grad if isinstance(t, nn.Parameter) else None, kind))
        if self.backend_name == "cuda":
            t.data = orig.to(self.device)
        self._ledger(orig.numel() * orig.element_size() if isinstance(t, nn.Parameter) else 0)

    def _move_rest(self, skip_ids: set[int]) -> None:
        """Move every parameter not yet offloaded, and every buffer, to the device."""
        moved = {id(t) for t, *_ in self._moved}
        for p in {id(p): p for p in self.model.parameters()}.values():
            if id(p) not in skip_ids and id(p) not in moved:
                self._move(p, "param")
        for b in self.model.buffers():
            if id(b) not in moved:
                self._move(b, "buffer")

    def _offload_group(self, g: _Group, originals: dict[int, torch.Tensor]) -> None:
        pin = self.backend_name == "cuda"
        file_backed = file_backed_checker()

        for i, block in enumerate(g.blocks):
            tier = self._tier(g.name, i)
            store = LayerStore.from_module(g.name, i, block, tier)
            # known to restore before it touches a parameter: an interrupt here loses nothing
            self._stores[(g.name, i)] = store
            # a parameter the naive strategy moved to the device must still come back to the host
            for s in store.slots:
                if id(s.param) in originals:
                    s.orig_data = originals.pop(id(s.param))
                    self._moved = [m for m in self._moved if m[0] is not s.param]
                    self._ledger(-s.numel * s.dtype.itemsize)
            if tier == "resident":
                # a pin granted to a resident layer's host copy is honoured: that copy is packed
                # (and page-locked on cuda), so the plan's pinned bytes are what is really locked
                granted = self._pin_rank(g.name, i) is not None
                store.host_fill(pin=pin and granted, file_backed=file_backed, exclusive=self._exclusive)
                self._count_released(store)
                bufs = store.alloc_device(self.device)
                store.copy_into(bufs, non_blocking=False)
                store.bind(bufs)
                self._resident_bufs[(g.name, i)] = bufs
                self._ledger(store.nbytes)
            else:
                store.host_fill(pin=pin and tier == "pinned", file_backed=file_backed,
                                exclusive=self._exclusive)
                self._count_released(store)
                store.unbind({dt: self._placeholder(dt) for dt in store.sizes()})

    def _count_released(self, store: LayerStore) -> None:
        if self.backend_name == "cuda":
            # a layer original the model had on the device is freed once its parameters are
            # rebound: from now its bytes count as the manager's, so device_bytes never reads
            # below zero (the high-water mark since the start still includes them)
            self._cuda_base -= store.released_device_bytes

    def _init(self) -> None:
        layer_ids = self._layer_param_ids()
        # read before anything moves: every parameter and buffer of the model, as found
        self._exclusive = exclusive_storages([*self.model.parameters(), *self.model.buffers()])
        if self.init_strategy == "grouped":
            by_name = {g.name: g for g in self._groups}
            for name in self.plan.init_order:
                self._offload_group(by_name[name], {})
            self._move_rest(layer_ids)
        else:
            done: set[int] = set()
            for g in self._groups:
                originals = {id(t): orig for t, orig, _, kind in self._moved if kind == "param"}
                self._offload_group(g, originals)
                done |= {id(p) for b in g.blocks for p in b.parameters()}
                # the whole model moves now, later groups included: the transient peak
                self._move_rest(done)

    def _make_staging(self) -> None:
        """K pinned staging buffers per group with staged layers (the plan's ledger says K)."""
        planned = (self.plan.ledger or {}).get("staging") or {}
        for g in self._groups:
            sizes = [self._stores[(g.name, i)].nbytes for i in g.streamed
                     if self._stores[(g.name, i)].tier == "staged"]
            count, nbytes = staging_size(self.plan.prefetch, sizes)
            if not count:
                continue
            count = int((planned.get(g.name) or {}).get("buffers", count)) or count
            g.pool = StagingPool(g.name, count, nbytes, pin=self.backend_name == "cuda")
        if self.stage_threads > 1 and any(g.pool for g in self._groups):
            self._stage_pool = ThreadPoolExecutor(self.stage_threads, thread_name_prefix="offload-lab-memcpy")

    def _blocks_host(self, g: _Group, i: int) -> bool:
        return self._stores[(g.name, i)].tier in ("pageable", "mapped")

    def _flush_pending(self, g: _Group) -> None:
        """Issue the host-blocking copies a pre-hook deferred: the block's kernels are queued now."""
        while g.pending:
            self._issue(g, g.pending.pop(0))

    def _arm(self, g: _Group) -> None:
        for i in g.streamed[: self._depth(g)]:
            self._issue(g, i)

    def _depth(self, g: _Group) -> int:
        return min(int(self.plan.prefetch), max(len(g.streamed) - 1, 0))

    # -- copies ----------------------------------------------------------------------------------------
    def _throttle(self, g: _Group) -> None:
        """Hold the host until a new device buffer keeps the group within ``prefetch + 1``.

        In the after-compute order on cuda a buffer the compute stream read is handed out
        again only once that compute has finished, and nothing else stops the host from
        running ahead of the GPU: without this wait it would allocate a buffer per layer it
        launches, up to the whole model on the device. Waiting for the compute that read the
        oldest released buffer keeps the device peak where the planner puts it; the host is
        held only while it is ahead, so no copy or compute starts later.
        """
        if not self._backend.bounds_run_ahead:
            return
        cap = self._depth(g) + 1
        while g.released and self._backend.is_done(g.released[0]):
            g.released.popleft()
            g.outstanding -= 1
        while g.outstanding + 1 > cap and g.released:
            self._backend.wait_done(g.released.popleft())
            g.outstanding -= 1

    def _issue(self, g: _Group, i: int) -> CopyTicket:
        store = self._stores[(g.name, i)]
        self._throttle(g)
        g.outstanding += 1
        ticket = CopyTicket(g.name, i, store.tier, store.nbytes)
        with self._backend.alloc_context(g.name):
            ticket.bufs = store.alloc_device(self.device)
        self._ledger(store.nbytes)

        def work(non_blocking: bool) -> None:
            store.copy_into(ticket.bufs, non_blocking=non_blocking)

        # a profiler trace then credits the copy to the layer it carries, not to the layer
        # whose pre-hook issued it (prefetch runs one layer ahead)
        with torch.profiler.record_function(f"offload_lab.copy {g.name}.{i}"):
            if store.tier == "staged" and g.pool is not None:
                bufs, threads = ticket.bufs, self._stage_pool
                self._backend.issue_staged(
                    ticket, g.pool, lambda buf: store.stage_into(buf, threads),
                    lambda buf, nb: store.copy_from_staging(bufs, buf, nb))
            else:
                self._backend.issue(ticket, work, blocking=store.tier != "pinned")
        g.in_flight[i] = ticket
        return ticket

    # -- hooks -------------------------------------------------------------------------------------------
    def _install_hooks(self) -> None:
        for g in self._groups:
            for i, block in enumerate(g.blocks):
                hooks = self._make_hooks(g, i)
                self._hooks.append(block.register_forward_pre_hook(hooks.pre_forward))
                self._hooks.append(block.register_forward_hook(hooks.post_forward))

    def _make_hooks(self, g: _Group, i: int) -> LayerHooks:
        return LayerHooks(self, g, i)

    def _refuse_backward(self, where: str) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if self._backward_refused:
                return
            self._backward_refused = True
            self._restore()
            raise OffloadError(
                f"backward through offloaded layer {where}: offload(...) is for inference only (a "
                f"layer's weights leave the device after its forward); the model is restored. Run the "
                f"forward under torch.no_grad() or torch.inference_mode(), or train outside offload(...)")

        return hook

    # -- memory -----------------------------------------------------------------------------------------
    def _device_bytes(self) -> int:
        if self.backend_name == "cuda":
            return torch.cuda.memory_allocated(self.device) - self._cuda_base
        return self._device_ledger

    def _pinned_bytes(self) -> int:
        return (sum(s.pinned_bytes for s in self._stores.values())
                + sum(g.pool.pinned_bytes for g in self._groups if g.pool is not None))

    # -- the Run -----------------------------------------------------------------------------------------
    def _events(self, r: Callable[[Any], float], warmup: int) -> list[dict]:
        events = []
        for rec in self._records:
            where = self._locate(rec["stamp"])
            if where is None:  # a block run by hand outside any call or step
                continue
            base = {"run": self._meta["run"], "step": where[0], "call": where[1], "group": rec["group"],
                    "layer": rec["layer"], "tier": rec["tier"]}
            start, end = r(rec["start"]), r(rec["end"])
            t = rec.get("ticket")
            if t is not None:
                c0, c1 = r(t.start), r(t.end)
                events.append({**base, "kind": "copy", "stream": "copy", "bytes": t.nbytes,
                               "start_s": c0, "end_s": c1})
                if t.stage is not None:
                    events.append({**base, "kind": "stage", "stream": "host_copy", "bytes": t.nbytes,
                                   "start_s": t.stage[0], "end_s": t.stage[1]})
                if t.host_block is not None:
                    events.append({**base, "kind": "host_block", "stream": "host", "bytes": t.nbytes,
                                   "start_s": t.host_block[0], "end_s": t.host_block[1]})
                w = r(rec["wait"])
                if c1 > w:
                    events.append({**base, "kind": "wait", "stream": "compute", "bytes": 0,
                                   "start_s": w, "end_s": max(start, c1)})
            events.append({**base, "kind": "compute", "stream": "compute", "bytes": 0,
                           "start_s": start, "end_s": end})
        return events

    def _placement(self) -> tuple[pd.DataFrame, dict[str, Any]]:
        return self.plan.layers, {"device_peak": self._device_peak()}

    def _device_peak(self) -> dict[str, Any]:
        """Predicted (the planner's estimate) and measured device peak, side by side."""
        led = self.plan.ledger
        if self.backend_name == "cuda":
            # the allocator's high-water mark since the manager started: weights and activations
            measured = int(torch.cuda.max_memory_allocated(self.device) - self._cuda_base)
            how = "torch.cuda.max_memory_allocated since the manager started (weights + activations)"
        else:
            measured = max([int(m["device_bytes"]) for m in self._memory] + [int(self._init_peak)])
            how = "layer and non-layer weights the cpu backend holds as its device (no activations)"
        return {
            "predicted_bytes": int(self.plan.device_peak),
            "predicted_activation_bytes": int(led.get("device_activation_bytes", 0) or 0),
            "measured_bytes": measured, "measured_how": how,
            "device_memory": led.get("device_memory"),
        }


class LayerHooks:
    """The forward hooks of one layer: ``pre_forward`` brings its weights to the device (and
    issues the prefetches behind it), ``post_forward`` releases them and records the interval."""

    def __init__(self, manager: OffloadManager, g: _Group, i: int):
        self.manager, self.group, self.index = manager, g, i
        self.streamed = i in g.pos
        self.tier = manager._tier(g.name, i)
        self.store = manager._stores[(g.name, i)]
        self.nbytes = self.store.nbytes
        self.where = f"{g.name}.{i}"
        self._open: list[dict] = []  # a block may be re-entered (recursion): a stack

    def pre_forward(self, module: nn.Module, args: Any) -> None:
        m, g, i = self.manager, self.group, self.index
        rec = {"group": g.name, "layer": i, "tier": self.tier, "bytes": self.nbytes, "stamp": m._stamp()}
        if self.streamed:
            ticket = g.in_flight.pop(i, None)
            if ticket is None:  # not prefetched (prefetch 0, or a layer run out of order)
                if i in g.pending:
                    g.pending.remove(i)
                m._issue(g, i)
                ticket = g.in_flight.pop(i)
            k, n = g.pos[i], len(g.streamed)
            defer = m.issue_order == "after-compute"
            for d in range(1, m._depth(g) + 1):
                j = g.streamed[(k + d) % n]
                if j not in g.in_flight and j != i and j not in g.pending:
                    if defer and m._blocks_host(g, j):
                        g.pending.append(j)  # issued by the post-hook, behind this block
                    else:
                        m._issue(g, j)
            w, c = m._backend.wait(ticket)
            self.store.bind(ticket.bufs)
            g.live[i] = ticket
            rec.update(ticket=ticket, wait=w, start=c)
        else:
            rec["start"] = m._backend.mark()
        self._open.append(rec)

    def post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        m, g, i = self.manager, self.group, self.index
        rec = self._open.pop()
        rec["end"] = m._backend.mark()
        m._records.append(rec)
        if self.streamed:
            ticket = g.live.pop(i)
            self.store.unbind(m._placeholders)
            ticket.bufs = {}
            g.released.append(rec["end"])  # the buffers are free once this block has run
            m._ledger(-self.nbytes)
            m._flush_pending(g)
        if torch.is_grad_enabled():
            # the weights a backward would read are gone once this returns: say so at the first one
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(m._refuse_backward(self.where))
        if m.record_memory:
            m._sample_memory()


def _tensors(output: Any) -> list[torch.Tensor]:
    """The tensors of a block's output (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return [t for o in output for t in _tensors(o)]
    return []


def _names(names: list[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _refuse_meta(model: nn.Module) -> None:
    """Refuse a model with tensors on the meta device: there is nothing to offload."""
    for kind, items in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        meta = [n for n, t in items if t.is_meta]
        if meta:
            raise OffloadError(
                f"{kind}(s) {_names(meta)} of {type(model).__name__} are on the meta device (no data to "
                f"offload): load the weights first, e.g. model.load_state_dict(state, assign=True) or "
                f"model.to_empty(device='cpu') and then load them")


def _refuse_containers(name: str, blocks: nn.ModuleList) -> None:
    """Refuse a group whose items are module containers: they are never called, so no hook runs."""
    inner = [f"{name}.{k}" for k, b in enumerate(blocks) if isinstance(b, (nn.ModuleList, nn.ModuleDict))]
    if inner:
        kind = type(blocks[int(inner[0].rsplit(".", 1)[1])]).__name__
        raise OffloadError(
            f"plan group {name!r} holds module containers ({inner[0]} is an nn.{kind}): a container is "
            f"never called, so its layers could not be streamed; name the lists of callable blocks "
            f"with spec_of(model, groups=[...]) (e.g. groups={[f'{n}' for n in inner[:2]]}) and plan that")


def _refuse_shared(groups: list[_Group]) -> None:
    """Refuse layers that share a parameter: each layer's weights must be its own to be streamed."""
    owners: dict[int, list[tuple[str, str]]] = {}
    for grp in groups:
        for i, block in enumerate(grp.blocks):
            seen: set[int] = set()
            for pname, p in block.named_parameters(remove_duplicate=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    owners.setdefault(id(p), []).append((f"{grp.name}.{i}", f"{grp.name}.{i}.{pname}"))
    shared = [o for o in owners.values() if len(o) > 1]
    if shared:
        layers = [layer for layer, _ in shared[0]]
        names = [n for _, n in shared[0]]
        more = f" ({len(shared) - 1} more parameter(s) shared likewise)" if len(shared) > 1 else ""
        raise OffloadError(
            f"layers {_names(layers)} share one parameter ({' = '.join(names[:3])}){more}: a layer's weights "
            f"must be its own to be streamed; untie them (give each layer its own copy) or move the shared "
            f"module out of the layer list so it stays on the device as a non-layer weight")
