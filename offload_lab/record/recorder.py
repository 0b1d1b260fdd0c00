"""What every live recorder shares: steps, memory samples, run meta, restore, the Run.

:class:`~offload_lab.record.runtime.OffloadManager` (which moves the weights) and
:class:`~offload_lab.record.observer.Observer` (which only watches) both record interval events
on a backend's clock between step boundaries. This base holds that bookkeeping once; a
subclass says how it starts, how it restores the model, and which events and placement it saw.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import platform
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
import torch

from offload_lab.checks import check_choice, check_int
from offload_lab.planning.hostmem import HostMemory, process_memory
from offload_lab.record.gather import rank_meta
from offload_lab.record.run import Run
from offload_lab.record.steps import Call, SchedulerWrap, group_calls, scheduler_of

#: how often one restore action is retried when an interrupt cuts it short
RESTORE_ATTEMPTS = 3


@contextlib.contextmanager
def interrupts_held() -> Iterator[list[int]]:
    """Hold SIGINT for the block; the list names the signals that arrived meanwhile.

    Only the main thread can own signal handlers; elsewhere nothing is held.

    >>> with interrupts_held() as held:
    ...     pass
    >>> held
    []
    """
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    try:
        prev = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    except (ValueError, TypeError, OSError):  # an embedding that owns signals: nothing to hold
        yield held
        return
    try:
        yield held
    finally:
        # a handler installed outside Python reads back as None: fall back to Python's own
        signal.signal(signal.SIGINT, prev if prev is not None else signal.default_int_handler)


def run_all(actions: list[Callable[[], None]]) -> list[BaseException]:
    """Run every action even when some fail or are interrupted; return what was raised.

    An action cut short by a KeyboardInterrupt is run again (actions must be idempotent), up to
    :data:`RESTORE_ATTEMPTS` times, so that an interrupt never leaves the model half restored.

    >>> seen = []
    >>> errors = run_all([lambda: seen.append(1), lambda: 1 / 0, lambda: seen.append(3)])
    >>> seen, [type(e).__name__ for e in errors]
    ([1, 3], ['ZeroDivisionError'])
    """
    errors: list[BaseException] = []
    for act in actions:
        for _ in range(RESTORE_ATTEMPTS):
            try:
                act()
                break
            except KeyboardInterrupt as e:
                errors.append(e)
            except BaseException as e:  # keep restoring; report after
                errors.append(e)
                break
    return errors


def resolve_device(backend: str, device: torch.device | str | None, accepted: tuple[str, ...],
                   error: type[Exception]) -> tuple[str, torch.device]:
    """The backend (``auto`` resolved) and the device it records on, or ``error`` saying why not.

    >>> resolve_device("cpu", None, ("auto", "cuda", "cpu"), ValueError)
    ('cpu', device(type='cpu'))
    """
    check_choice("backend", backend, accepted, error=error)
    if backend == "auto":
        backend = "cuda" if torch.cuda.is_available() else "cpu"
    if backend == "cuda" and not torch.cuda.is_available():
        raise error("backend 'cuda' was asked for but torch sees no CUDA device; use 'cpu' or 'auto'")
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "cuda" else torch.device("cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise error(f"device {device!r} is not a torch device; accepted: 'cpu', 'cuda', 'cuda:1', ...") from None
    if device.type != ("cuda" if backend == "cuda" else "cpu"):
        raise error(f"device {str(device)!r} does not match backend {backend!r}")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return backend, device


class Recorder:
    """Base of the live recorders: step boundaries, memory samples, run meta and ``build_run``.

    Subclasses set :attr:`_error` (their error class) and :attr:`_context` (how a user enters
    them, for messages), and implement :meth:`_restore_actions`, :meth:`_events`,
    :meth:`_placement` and the memory readers.
    """

    _error: type[Exception] = ValueError
    _context: str = "the recorder"
    #: seconds between two memory samples taken between steps (0: every sample is kept)
    _sample_every_s: float = 0.0
    #: whether memory is sampled at all (a manager may be asked not to)
    record_memory: bool = True

    def __init__(self) -> None:
        self._backend: Any = None
        self._bounds: list[dict] = []
        self._memory: list[dict] = []
        self._step: int | None = None
        self._steps_done = 0
        self._entered = False
        self._meta: dict[str, Any] = {}
        self._last_sample = float("-inf")
        # top-level calls of the recorded modules, and the scheduler steps seen between them
        self._calls: list[Call] = []
        self._ticks: list[Any] = []
        self._open_call: dict[str, Call] = {}
        self._call_depth: dict[str, int] = {}
        self._call_hooks: list = []
        self._sched_wrap: SchedulerWrap | None = None
        self._where: dict[int, tuple[int, int]] = {}
        self._explicit_at: dict[int, int] = {}
        #: ``"auto"``: the scheduler of the pipeline the model belongs to; None: none; or an object
        self._scheduler_target: Any = "auto"

    # -- meta ------------------------------------------------------------------------------------
    def _base_meta(self, backend: str, device: torch.device, model: str) -> dict[str, Any]:
        """The meta every live run carries, built in one place."""
        return {
            "run": uuid.uuid4().hex[:12],
            "backend": backend,
            "simulated": False,
            "device": str(device),
            "device_name": self._backend.device_name(),
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "platform": platform.platform(),
            "model": model,
            "host": HostMemory.probe().to_dict(),
            # where this process sits in a torch.distributed job (rank 0 of 1 on its own)
            **rank_meta(),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }

    # -- enter / exit ----------------------------------------------------------------------------
    def _claim(self) -> None:
        """Refuse a second recorder on the same model, then register this one."""
        raise NotImplementedError

    def _start(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self._claim()
        self._entered = True
        try:
            self._start()
            self._watch_calls()
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._restore()

    # -- restore ---------------------------------------------------------------------------------
    def _restore_actions(self) -> list[Callable[[], None]]:
        raise NotImplementedError

    def _restore(self) -> None:
        """Undo everything, whatever arrives meanwhile; then re-raise an interrupt or report errors.

        SIGINT is held for the whole restore and every action is run (and retried when an
        interrupt cuts it short), so Ctrl-C can never leave a model half restored.
        """
        with interrupts_held() as held:
            errors = run_all([self._unwatch_calls, *self._restore_actions()])
        fatal = [e for e in errors if not isinstance(e, Exception)]
        if fatal:
            raise fatal[0]
        if held:
            raise KeyboardInterrupt
        if errors:
            raise RuntimeError(f"restoring the model hit {len(errors)} error(s): {errors[0]!r}") from errors[0]

    # -- calls -----------------------------------------------------------------------------------
    def _call_roots(self) -> dict[str, list[Any]]:
        """The modules whose top-level forwards are calls, by name (a subclass may name several)."""
        return {"": [self.model]}  # type: ignore[attr-defined]

    def _watch_calls(self) -> None:
        """Hook the call roots and wrap the scheduler's ``step`` (both undone on restore)."""
        for root, mods in self._call_roots().items():
            self._call_depth[root] = 0
            pre, post = self._make_call_hooks(root)
            for m in mods:
                self._call_hooks.append(m.register_forward_pre_hook(pre, prepend=True))
                self._call_hooks.append(m.register_forward_hook(post, always_call=True))
        target = self._scheduler_target
        sched = scheduler_of(self.model if isinstance(target, str) else target)  # type: ignore[attr-defined]
        if sched is not None:
            self._sched_wrap = SchedulerWrap(sched, self._tick)
            self._meta["scheduler"] = type(sched).__name__

    def _unwatch_calls(self) -> None:
        if self._sched_wrap is not None:
            self._sched_wrap.restore()
            self._sched_wrap = None
        while self._call_hooks:
            self._call_hooks[-1].remove()
            self._call_hooks.pop()
        self._open_call.clear()

    def _tick(self) -> None:
        if self._entered and self._backend is not None:
            self._ticks.append(self._backend.end_step() if self._step is None else self._backend.mark())

    def _make_call_hooks(self, root: str) -> tuple[Callable, Callable]:
        def pre(module, args):
            depth = self._call_depth[root]
            self._call_depth[root] = depth + 1
            if depth:
                return
            self._call_starting(root)
            explicit = self._step
            if explicit is None:
                self._before_step()
                start = self._backend.begin_step()
                self._step_opened()
            else:
                start = None
            c = Call(len(self._calls), start, None, explicit, len(self._ticks), root)
            self._calls.append(c)
            self._open_call[root] = c

        def post(module, args, *rest):
            self._call_depth[root] = max(self._call_depth[root] - 1, 0)
            if self._call_depth[root]:
                return
            c = self._open_call.pop(root, None)
            if c is None:
                return
            if c.explicit is None:
                self._step_closing()
                c.end = self._backend.end_step()
                if self.record_memory:
                    self._sample_memory(force=True)
            else:
                c.end = c.start

        return pre, post

    def _call_starting(self, root: str) -> None:
        """Called as a top-level call of ``root`` starts, before it is recorded."""

    def _stamp(self) -> tuple[int | None, int | None]:
        """What an event recorded now belongs to: (explicit step or None, call id or None)."""
        c = max(self._open_call.values(), key=lambda x: x.cid, default=None)  # the innermost
        return self._step, (c.cid if c is not None else None)

    def _locate(self, stamp: tuple[int | None, int | None]) -> tuple[int, int] | None:
        """(step, call) of an event's stamp in the built run, or None when it is in no step."""
        xs, cid = stamp
        if cid is not None and cid in self._where:
            return self._where[cid]
        if xs is not None and xs in self._explicit_at:
            return self._explicit_at[xs], 0
        return None

    def _group_steps(self) -> tuple[list[dict], str]:
        """Step bounds (markers) from calls, explicit steps and ticks; fills the stamp lookup."""
        calls = [c for c in self._calls if c.end is not None or c.explicit is not None]
        groups, how = group_calls(calls, self._bounds, self._ticks)
        by_id = {c.cid: c for c in calls}
        self._where, self._explicit_at = {}, {}
        bounds = []
        for g in groups:
            if g.explicit is not None:
                self._explicit_at[g.explicit] = g.first
            per_root: dict[str, int] = {}
            for cid in g.calls:
                root = by_id[cid].root
                self._where[cid] = (g.first, per_root.get(root, 0))
                per_root[root] = per_root.get(root, 0) + 1
            bounds.append({"step": g.first, "start": g.start, "end": g.end})
        return bounds, how

    # -- steps -----------------------------------------------------------------------------------
    def _step_opened(self) -> None:
        """Called once a step's clock started (a subclass may take a snapshot)."""

    def _step_closing(self) -> None:
        """Called before a step's clock stops."""

    def _before_step(self) -> None:
        """Called before a step's clock starts (work that must not count)."""

    @contextlib.contextmanager
    def step(self) -> Iterator[Any]:
        """Mark one step (e.g. one denoising step: every forward of the model inside it)."""
        if not self._entered:
            raise self._error(f"step() must be used inside `with {self._context}`")
        if self._step is not None:
            raise self._error("steps do not nest")
        self._before_step()
        self._step = self._steps_done
        before = len(self._calls)
        start = self._backend.begin_step()
        try:
            self._step_opened()
            yield self
        finally:
            self._step_closing()
            end = self._backend.end_step()
            if self.record_memory:
                self._sample_memory(force=True)
            self._bounds.append({"step": self._step, "start": start, "end": end, "before": before})
            self._steps_done += 1
            self._step = None

    # -- memory ----------------------------------------------------------------------------------
    def _device_bytes(self) -> int:
        raise NotImplementedError

    def _pinned_bytes(self) -> int:
        raise NotImplementedError

    def _sample_memory(self, force: bool = False) -> None:
        # reading /proc costs ~100 µs: subclasses may thin out the samples taken between steps
        now = self._backend.now()
        if not force and now - self._last_sample < self._sample_every_s:
            return
        self._last_sample = now
        pm = process_memory()
        self._memory.append({
            "t_s": self._backend.host_to_device_time(now),
            "device_bytes": int(self._device_bytes()),
            "pinned_bytes": int(self._pinned_bytes()),
            "anon_bytes": int(pm["anon_bytes"]),
            "mapped_bytes": int(pm["file_bytes"]),
        })

    # -- the Run ---------------------------------------------------------------------------------
    def _events(self, resolve: Callable[[Any], float], warmup: int) -> list[dict]:
        raise NotImplementedError

    def _placement(self) -> tuple[pd.DataFrame, dict[str, Any]]:
        """The per-layer placement frame and meta entries that go with it."""
        raise NotImplementedError

    def _finish_events(self, events: list[dict], plan_layers: pd.DataFrame) -> None:
        """Complete events that need the placement (default: nothing to do)."""

    def build_run(self, warmup: int = 0) -> Run:
        """The Run recorded so far (markers resolved on the device clock).

        ``warmup`` steps are dropped from the frames (``meta['warmup_dropped']`` says how many).
        """
        if self._backend is None:
            raise self._error(f"nothing recorded yet: enter {self._context} first")
        check_int("warmup", warmup, minimum=0, error=self._error)
        self._backend.synchronize()
        r = self._backend.resolve
        marks, how = self._group_steps()
        self._kept_steps = {b["step"] for b in marks[warmup:]}
        events = self._events(r, warmup)
        plan_layers, extra = self._placement()
        self._finish_events(events, plan_layers)
        bounds = [{"step": b["step"], "start_s": r(b["start"]), "end_s": r(b["end"])} for b in marks]
        meta = {**self._meta, **extra, "steps_from": how, "calls_recorded": len(self._calls)}
        return Run.build(events, bounds, plan_layers, self._memory, meta, warmup=warmup)

    @property
    def run(self) -> Run:
        """:meth:`build_run` with no warm-up dropped."""
        return self.build_run()
