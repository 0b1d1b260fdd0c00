"""What the import keeps of a trace's rows: the category codes, the layer-name matcher, the
compact columns (:class:`Collected`) and the bounds on numbers, shared by the per-event loop
(:mod:`offload_lab.record.kineto.collect`) and the block decoder
(:mod:`offload_lab.record.kineto.fast`)."""

from __future__ import annotations

import re
from array import array
from collections.abc import Sequence

from offload_lab.record.schema import MAX_INDEX as FRAME_MAX_INDEX

__all__ = ["UNNAMED_GROUP", "MODULE_PATTERN", "MODULE", "MEMCPY", "STEP", "CATS", "GPU_KERNEL", "GPU_MEMCPY",
           "GPU_MEMSET", "GPU_ANN", "CPU_ANN", "PY_FN", "RUNTIME", "CPU_OP", "Matcher", "Collected", "MAX_US",
           "MAX_BYTES", "MAX_INDEX", "MAX_STEP", "step_span"]

#: the group of layers matched by a ``layer_pattern`` without a (non-empty) ``group`` group
UNNAMED_GROUP = "layers"

#: ``nn.Module: Block_3`` as written by torch.profiler with ``with_stack=True``.
MODULE_PATTERN = r"^nn\.Module: (?P<group>[A-Za-z_]\w*?)_(?P<layer>\d+)$"

MODULE = re.compile(MODULE_PATTERN)
MEMCPY = re.compile(r"Memcpy (\w+)(?: \((\w+) -> (\w+)\))?")
STEP = re.compile(r"ProfilerStep#(\d+)$")

# category -> handler code; Kineto's spellings across torch versions
GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET, GPU_ANN, CPU_ANN, PY_FN, RUNTIME, CPU_OP = range(8)
CATS = {
    "kernel": GPU_KERNEL, "Kernel": GPU_KERNEL,
    "gpu_memcpy": GPU_MEMCPY, "Memcpy": GPU_MEMCPY,
    "gpu_memset": GPU_MEMSET, "Memset": GPU_MEMSET,
    "gpu_user_annotation": GPU_ANN,
    "user_annotation": CPU_ANN,
    "python_function": PY_FN,
    "cuda_runtime": RUNTIME, "cuda_driver": RUNTIME, "Runtime": RUNTIME,
    "cpu_op": CPU_OP, "Operator": CPU_OP,
}




class Matcher:
    """Annotation name -> (group, layer) or None, cached (names repeat every step)."""

    def __init__(self, patterns: Sequence[re.Pattern]):
        self.patterns = patterns
        self.cache: dict[str, tuple[str, int] | None] = {}

    def __call__(self, name: str) -> tuple[str, int] | None:
        try:
            return self.cache[name]
        except KeyError:
            pass
        hit = None
        for p in self.patterns:
            m = p.search(name)
            if m:
                layer = int(m.group("layer"))
                # an index past the frames' bound names no layer (a run would refuse it)
                hit = (m.groupdict().get("group") or UNNAMED_GROUP, layer) if layer < MAX_STEP else None
                break
        if len(self.cache) < 1_000_000:
            self.cache[name] = hit
        return hit


class Collected:
    """Compact columns of the rows that matter, in raw trace microseconds."""

    def __init__(self) -> None:
        self.t0 = float("inf")
        self.t1 = float("-inf")
        self.lanes: dict[tuple, int] = {}
        self.lane_keys: list[tuple] = []       # (pid, tid-or-stream, is_gpu)
        self.k_ts, self.k_dur = array("d"), array("d")
        self.k_lane, self.k_corr = array("i"), array("q")
        self.r_corr, self.r_ts, self.r_lane = array("q"), array("d"), array("i")
        self.copies: list[tuple] = []          # (ts, dur, lane, corr, bytes, tier)
        self.other_copies: dict[str, list[int]] = {}   # direction -> [count, bytes]
        self.memcpy_calls: list[tuple] = []    # (name, ts, dur, lane, corr)
        self.gpu_spans: list[tuple] = []       # (lane, ts, end, (group, layer))
        self.cpu_spans: list[tuple] = []
        self.module_spans: list[tuple] = []
        self.steps: dict[int, list[float]] = {}
        self.by_cat: dict[str, int] = {}
        self.by_ph: dict[str, int] = {}
        self.negative_dur = 0
        self.bad_times = 0     # NaN, infinite or absurd ts / dur
        self.bad_bytes = 0     # memcpy bytes negative or absurd
        self.bad_steps = 0     # ProfilerStep numbers past MAX_STEP
        self.unmatched_annotations = 0
        self.unused = 0    # flow arrows and python frames other than nn.Module: never read
        self.devices: dict[int, int] = {}      # device id -> GPU rows


#: bounds past which a number in a trace is not a time, a byte count or a step (they would
#: overflow the frames' int64 / lose all precision in float64): such rows are counted and skipped
MAX_US = 1e17          # ~3,000 years in microseconds; Kineto writes µs since the epoch (~1.7e15)
MAX_BYTES = 1 << 50    # one copy of a PiB
MAX_INDEX = 1 << 53    # correlation ids
MAX_STEP = FRAME_MAX_INDEX  # step numbers and layer indices: what the frames accept (10^9)


def step_span(c: Collected, nm: str, ts: float, dur: float) -> None:
    ms = STEP.match(nm)
    if ms:
        n = int(ms.group(1))
        if n >= MAX_STEP:
            c.bad_steps += 1
            return
        span = c.steps.get(n)
        if span is None:
            c.steps[n] = [ts, ts + dur]
        else:  # the same step seen on two threads: one span around both
            span[0], span[1] = min(span[0], ts), max(span[1], ts + dur)
