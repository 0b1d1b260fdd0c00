"""Clocks, copy engines and markers for the two backends.

Both backends offer the same few operations to the manager: ``issue`` a layer's copy (async or
blocking the host), make compute ``wait`` for it, put ``mark``\\ s on the compute timeline, and
later ``resolve`` every marker to seconds from the run's origin. The ``cpu`` backend stands in a
thread for the copy stream and ``perf_counter`` for events; the ``cuda`` backend uses real
streams and timing events. A ``staged`` copy (``issue_staged``) goes through a stager thread
per group: it takes a free staging buffer, memcpys the layer into it on the host, then hands
the buffer to the copy engine, which copies it to the device and frees the buffer again.

Issue orders (``ISSUE_ORDERS``): ``"after-compute"`` (the default) lets the manager issue
copies that block the host after the current block's kernels are queued, and the cuda copy
stream allocates its own buffers so that it never waits for the whole compute stream: the
caching allocator hands a freed buffer out again only once the compute that last read it has
finished (``record_stream``). ``"before-compute"`` is what other runtimes do: every copy is
issued from the pre-hook after ``copy_stream.wait_stream(compute)``.

In the after-compute order on cuda (``bounds_run_ahead``) the manager holds the host, before it
allocates a copy's buffers, until the compute that read the group's oldest released buffers has
finished (``is_done`` / ``wait_done`` on that compute-end marker), so a group never holds more
than ``prefetch + 1`` layers on the device however far ahead of the GPU the host runs. The cpu
backend's host runs every block itself and never runs ahead; before-compute buffers come from the
compute stream, whose freed buffers the allocator reuses in stream order.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class CopyTicket:
    """One layer's copy in flight: its markers, and (cpu) the event that says it is done."""

    group: str
    layer: int
    tier: str
    nbytes: int
    start: Any = None
    end: Any = None
    host_block: tuple[float, float] | None = None
    done: threading.Event | None = None
    error: BaseException | None = None
    bufs: dict = field(default_factory=dict)
    stage: tuple[float, float] | None = None  # the host memcpy into a staging buffer (staged)
    own_stream: bool = False  # device buffers allocated on the copy stream (cuda, after-compute)


from offload_lab.planning.options import ISSUE_ORDERS  # noqa: E402, F401  (one list for every surface; the manager imports it here)


class _Stagers:
    """One stager thread per group: staging-buffer memcpys, then a hand-off to the copy engine."""

    def _init_stagers(self) -> None:
        self._stagers: dict[str, tuple[queue.Queue, threading.Thread]] = {}
        self._cancel = threading.Event()

    def issue_staged(self, ticket: CopyTicket, pool: Any, stage: Callable[[torch.Tensor], None],
                     dma: Callable[[torch.Tensor, bool], None]) -> None:
        """Stage ``ticket``'s layer through ``pool``: ``stage(buf)`` on the stager thread fills a
        free buffer, ``dma(buf, non_blocking)`` on the copy engine moves it to the device."""
        ticket.done = threading.Event()
        self._prepare_staged(ticket)
        entry = self._stagers.get(ticket.group)
        if entry is None:
            q: queue.Queue = queue.Queue()
            t = threading.Thread(target=self._run_stager, args=(q,), daemon=True,
                                 name=f"offload-lab-stage[{ticket.group}]")
            entry = self._stagers[ticket.group] = (q, t)
            t.start()
        entry[0].put((ticket, pool, stage, dma))

    def _prepare_staged(self, ticket: CopyTicket) -> None:
        pass

    def _thread_start(self) -> None:
        pass

    def _run_stager(self, q: queue.Queue) -> None:
        self._thread_start()
        while True:
            job = q.get()
            if job is None:
                return
            ticket, pool, stage, dma = job
            try:
                buf = None if self._cancel.is_set() else pool.acquire(self._cancel)
                if buf is None:
                    raise RuntimeError("the offload manager closed while this layer waited to be staged")
                t0 = self.now()
                try:
                    stage(buf.data)
                except BaseException:
                    pool.release(buf)
                    raise
                ticket.stage = (t0, self.now())
            except BaseException as e:  # surfaced to the host thread at wait()
                ticket.error = e
                ticket.done.set()
                continue
            self._handoff(ticket, pool, buf, dma)

    def _close_stagers(self) -> None:
        # stop staging first: the copy engines must stay up to give back buffers in flight
        self._cancel.set()
        for q, _ in self._stagers.values():
            q.put(None)
        for _, t in self._stagers.values():
            t.join(timeout=60)
        self._stagers.clear()

    def stagers_alive(self) -> int:
        return sum(t.is_alive() for _, t in self._stagers.values())


class CpuBackend(_Stagers):
    """The CPU is the device; a copy-engine thread per group stands in for each copy stream."""

    name = "cpu"

    bounds_run_ahead = False  # the host runs every block itself: it is never ahead

    def __init__(self, device: torch.device, issue: str = "after-compute"):
        self.device = device
        self.issue_order = issue
        self._init_stagers()
        self.origin = time.perf_counter()
        self._queues: dict[str, queue.Queue] = {}
        self._threads: dict[str, threading.Thread] = {}

    def device_name(self) -> str:
        import platform

        return platform.processor() or platform.machine() or "cpu"

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def mark(self) -> float:
        return self.now()

    @staticmethod
    def is_done(marker: float) -> bool:
        return True

    @staticmethod
    def wait_done(marker: float) -> None:
        pass

    # -- copy engine ---------------------------------------------------------------------------
    def _engine(self, group: str) -> queue.Queue:
        q = self._queues.get(group)
        if q is None:
            q = queue.Queue()
            t = threading.Thread(target=self._run_engine, args=(q,), name=f"offload-lab-copy[{group}]",
                                 daemon=True)
            self._queues[group], self._threads[group] = q, t
            t.start()
        return q

    def _run_engine(self, q: queue.Queue) -> None:
        while True:
            job = q.get()
            if job is None:
                return
            ticket, work = job
            try:
                ticket.start = self.now()
                work()
                ticket.end = self.now()
            except BaseException as e:  # surfaced to the host thread at wait()
                ticket.error = e
                ticket.end = self.now()
            finally:
                ticket.done.set()

    def issue(self, ticket: CopyTicket, work: Callable[[bool], None], blocking: bool) -> None:
        """Run ``work(non_blocking)``: on the host thread when ``blocking``, else on the engine."""
        ticket.done = threading.Event()
        if blocking:
            t0 = self.now()
            work(False)
            t1 = self.now()
            ticket.start, ticket.end, ticket.host_block = t0, t1, (t0, t1)
            ticket.done.set()
        else:
            self._engine(ticket.group).put((ticket, lambda: work(False)))

    def alloc_context(self, group: str) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def _handoff(self, ticket: CopyTicket, pool: Any, buf: Any, dma: Callable) -> None:
        def work() -> None:
            try:
                dma(buf.data, False)
            finally:
                pool.release(buf)

        self._engine(ticket.group).put((ticket, work))

    def wait(self, ticket: CopyTicket) -> tuple[float, float]:
        """Block compute until the copy is done; returns (ready-to-run time, start time)."""
        t_w = self.now()
        ticket.done.wait()
        if ticket.error is not None:
            raise RuntimeError(f"copy of {ticket.group}.{ticket.layer} failed") from ticket.error
        return t_w, self.now()

    def begin_step(self) -> float:
        return self.now()

    def end_step(self) -> float:
        return self.now()

    def resolve(self, marker: Any) -> float:
        return float(marker)

    def host_to_device_time(self, t: float) -> float:
        return t

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        self._close_stagers()
        for q in self._queues.values():
            q.put(None)
        for t in self._threads.values():
            t.join(timeout=60)
        self._queues.clear()
        self._threads.clear()

    def threads_alive(self) -> int:
        return sum(t.is_alive() for t in self._threads.values()) + self.stagers_alive()


class CudaBackend(_Stagers):
    """Real CUDA streams: one copy stream per group, timing events on both streams."""

    name = "cuda"

    def __init__(self, device: torch.device, issue: str = "after-compute"):
        self.device = device
        self.issue_order = issue
        self.bounds_run_ahead = issue == "after-compute"
        self._init_stagers()
        torch.cuda.set_device(device)
        self.compute = torch.cuda.current_stream(device)
        self._streams: dict[str, torch.cuda.Stream] = {}
        torch.cuda.synchronize(device)
        self._origin_ev = self._event()
        self._origin_ev.record(self.compute)
        torch.cuda.synchronize(device)
        self._host_origin = time.perf_counter()
        self._offset = 0.0  # device-clock minus host-clock, re-anchored at each step

    def device_name(self) -> str:
        return torch.cuda.get_device_name(self.device)

    def _event(self) -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    def now(self) -> float:
        return time.perf_counter() - self._host_origin

    def host_to_device_time(self, t: float) -> float:
        return t + self._offset

    def mark(self) -> torch.cuda.Event:
        ev = self._event()
        ev.record(self.compute)
        return ev

    @staticmethod
    def is_done(marker: torch.cuda.Event) -> bool:
        return marker.query()

    @staticmethod
    def wait_done(marker: torch.cuda.Event) -> None:
        marker.synchronize()

    def stream(self, group: str) -> torch.cuda.Stream:
        s = self._streams.get(group)
        if s is None:
            s = self._streams[group] = torch.cuda.Stream(self.device)
        return s

    def alloc_context(self, group: str) -> contextlib.AbstractContextManager:
        """Where the manager allocates a copy's device buffers: on the copy stream in the
        after-compute order (the allocator then keeps a freed buffer until the compute that
        read it is done), else on the compute stream."""
        if self.issue_order == "after-compute":
            return torch.cuda.stream(self.stream(group))
        return contextlib.nullcontext()

    def issue(self, ticket: CopyTicket, work: Callable[[bool], None], blocking: bool) -> None:
        s = self.stream(ticket.group)
        if self.issue_order == "before-compute":
            # never overwrite a buffer the compute stream may still read: wait for all of it
            s.wait_stream(self.compute)
        else:
            ticket.own_stream = True
        ticket.start, ticket.end = self._event(), self._event()
        t0 = self.now()
        with torch.cuda.stream(s):
            ticket.start.record(s)
            # pinned: asynchronous DMA. pageable/mapped: the host waits for the copy, as the
            # driver makes it do for memory it cannot DMA from directly.
            work(not blocking)
            ticket.end.record(s)
        if blocking:
            ticket.end.synchronize()
            t1 = self.now()
            ticket.host_block = (self.host_to_device_time(t0), self.host_to_device_time(t1))

    def _prepare_staged(self, ticket: CopyTicket) -> None:
        s = self.stream(ticket.group)  # made here, on the host thread
        if self.issue_order == "before-compute":
            s.wait_stream(self.compute)
        else:
            ticket.own_stream = True
        ticket.start, ticket.end = self._event(), self._event()

    def _thread_start(self) -> None:
        torch.cuda.set_device(self.device)  # the current device is per thread

    def _handoff(self, ticket: CopyTicket, pool: Any, buf: Any, dma: Callable) -> None:
        s = self.stream(ticket.group)
        try:
            with torch.cuda.stream(s):
                ticket.start.record(s)
                dma(buf.data, True)  # from page-locked memory: an asynchronous DMA
                ticket.end.record(s)
            pool.release(buf, ticket.end)  # reused once this DMA's event completes
            t0, t1 = ticket.stage
            ticket.stage = (self.host_to_device_time(t0), self.host_to_device_time(t1))
        except BaseException as e:
            pool.release(buf, None)
            ticket.error = e
        finally:
            ticket.done.set()

    def wait(self, ticket: CopyTicket) -> tuple[Any, Any]:
        if ticket.done is not None:
            # a staged copy: its DMA is queued by the stager; an unrecorded event is no wait
            ticket.done.wait()
            if ticket.error is not None:
                raise RuntimeError(f"copy of {ticket.group}.{ticket.layer} failed") from ticket.error
        t_w = self.mark()
        self.compute.wait_event(ticket.end)
        if ticket.own_stream:
            for b in ticket.bufs.values():
                b.record_stream(self.compute)
        return t_w, self.mark()

    def begin_step(self) -> Any:
        torch.cuda.synchronize(self.device)
        ev = self.mark()
        ev.synchronize()
        self._offset = self.resolve(ev) - self.now()
        return ev

    def end_step(self) -> Any:
        ev = self.mark()
        torch.cuda.synchronize(self.device)
        return ev

    def resolve(self, marker: Any) -> float:
        if isinstance(marker, float):
            return marker
        return self._origin_ev.elapsed_time(marker) / 1e3

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self._close_stagers()
        torch.cuda.synchronize(self.device)

    def threads_alive(self) -> int:
        return self.stagers_alive()
