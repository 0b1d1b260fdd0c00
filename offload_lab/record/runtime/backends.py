"""Clocks, copy engines and markers for the two backends.

Both backends offer the same few operations to the manager: ``issue`` a layer's copy (async or
blocking the host), make compute ``wait`` for it, put ``mark``\\ s on the compute timeline, and
later ``resolve`` every marker to seconds from the run's origin. The ``cpu`` backend stands in a
thread for the copy stream and ``perf_counter`` for events; the ``cuda`` backend uses real
streams and timing events.
"""

from __future__ import annotations

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


class CpuBackend:
    """The CPU is the device; a copy-engine thread per group stands in for each copy stream."""

    name = "cpu"

    def __init__(self, device: torch.device):
        self.device = device
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
        for q in self._queues.values():
            q.put(None)
        for t in self._threads.values():
            t.join(timeout=60)
        self._queues.clear()
        self._threads.clear()

    def threads_alive(self) -> int:
        return sum(t.is_alive() for t in self._threads.values())


class CudaBackend:
    """Real CUDA streams: one copy stream per group, timing events on both streams."""

    name = "cuda"

    def __init__(self, device: torch.device):
        self.device = device
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

    def stream(self, group: str) -> torch.cuda.Stream:
        s = self._streams.get(group)
        if s is None:
            s = self._streams[group] = torch.cuda.Stream(self.device)
        return s

    def issue(self, ticket: CopyTicket, work: Callable[[bool], None], blocking: bool) -> None:
        s = self.stream(ticket.group)
        # never overwrite a buffer the compute stream may still read
        s.wait_stream(self.compute)
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

    def wait(self, ticket: CopyTicket) -> tuple[Any, Any]:
        t_w = self.mark()
        self.compute.wait_event(ticket.end)
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
        torch.cuda.synchronize(self.device)

    def threads_alive(self) -> int:
        return 0
