"""The ``pin_memory`` evidence stage: torch's caching-allocator pinning vs offload-lab's exact stores.

For a set of Wan2.1-T2V-14B-shaped blocks, each block's weights are packed into one host buffer
of its store size (exactly what the runtime's ``LayerStore`` packs) and held three ways:

- ``pageable``: ordinary host memory (the baseline every pinned copy should beat);
- ``torch pin_memory()``: that buffer's ``tensor.pin_memory()``, served by torch's caching
  host allocator, which rounds each block up to a power of two;
- ``exact registered store``: ``LayerStore.host_fill(pin=True)``, an anonymous mapping of the
  store's own size registered with ``cudaHostRegister``.

For each: host-to-device GB/s (every block copied once per repeat on a side stream, timed with
CUDA events), and what the host reports as locked: ``/proc/self/status`` ``VmLck`` and
``VmPin`` deltas, torch's ``host_memory_stats()`` deltas, beside the requested bytes and the
planner's ``pinned_footprint`` predictions (``exact`` and ``pow2``). Without CUDA nothing can
be pinned: the stage then runs the same code on pageable buffers (``"pinned": False``) and its
GB/s are host-to-host memcpy rates.
"""

from __future__ import annotations

import time
from typing import Any

MODEL = "wan2.1-t2v-14b"
GiB = 2**30


def proc_status(path: str = "/proc/self/status") -> dict[str, int]:
    """``VmLck``, ``VmPin`` and ``VmRSS`` of this process in bytes (0 where absent)."""
    out = {"VmLck": 0, "VmPin": 0, "VmRSS": 0}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out
    for line in lines:
        key, _, rest = line.partition(":")
        if key in out and rest.split():
            out[key] = int(rest.split()[0]) * 1024  # the kernel writes kB
    return out


def _host_stats(cuda: bool) -> dict[str, float]:
    import torch

    if not cuda:
        return {}
    return {k: v for k, v in torch.cuda.host_memory_stats().items() if isinstance(v, (int, float))}


def _delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def _empty_host_cache() -> None:
    import torch

    fn = getattr(torch.accelerator, "empty_host_cache", None) or getattr(torch._C, "_host_emptyCache", None)
    if fn is not None:
        fn()


def copy_gbps(buffers: list[dict], dev, repeats: int) -> list[float]:
    """H2D GB/s of copying every block's buffers once, ``repeats`` times after one untimed pass
    (device clock on cuda, ``perf_counter`` on a cpu)."""
    import torch

    total = sum(b.numel() * b.element_size() for bufs in buffers for b in bufs.values())
    dst = [{dt: torch.empty_like(b, device=dev) for dt, b in bufs.items()} for bufs in buffers]
    cuda = dev.type == "cuda"
    stream = torch.cuda.Stream(dev) if cuda else None
    rates = []
    for k in range(repeats + 1):  # pass 0 touches the destination pages and is not counted
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                start.record()
                for d, s in zip(dst, buffers):
                    for dt, b in s.items():
                        d[dt].copy_(b, non_blocking=True)
                end.record()
            end.synchronize()
            secs = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for d, s in zip(dst, buffers):
                for dt, b in s.items():
                    d[dt].copy_(b)
            secs = time.perf_counter() - t0
        if k:
            rates.append(total / secs / 1e9)
    del dst
    return rates


def _packed(store) -> dict:
    """A pageable copy of the layer packed exactly as its store (one buffer per dtype)."""
    import torch

    bufs = {dt: torch.zeros(n, dtype=dt) for dt, n in store.sizes().items()}
    for s in store.slots:
        bufs[s.dtype][s.offset:s.offset + s.numel].view(s.shape).copy_(s.param.data)
    return bufs


def measure_method(name: str, make, dev, repeats: int) -> dict[str, Any]:
    """Allocate with ``make()`` (the per-block buffers, the bytes offload-lab counts as locked, a
    release), copy them ``repeats`` times, release them; what the host reported at each point."""
    import gc

    cuda = dev.type == "cuda"
    st0, hs0 = proc_status(), _host_stats(cuda)
    t0 = time.perf_counter()
    buffers, locked_by_us, release = make()
    alloc_s = time.perf_counter() - t0
    st1, hs1 = proc_status(), _host_stats(cuda)
    rates = copy_gbps(buffers, dev, repeats)
    res = {
        "requested_bytes": sum(b.numel() * b.element_size() for bufs in buffers for b in bufs.values()),
        "locked_bytes_counted": locked_by_us,
        "proc_status_delta": _delta(st1, st0),
        "torch_host_memory_stats_delta": _delta(hs1, hs0),
        "alloc_s": alloc_s, "gbps": rates, "gbps_median": sorted(rates)[len(rates) // 2],
        "pinned": cuda and name != "pageable",
    }
    buffers.clear()  # the last references: a cached pinned block can only be freed once dead
    gc.collect()
    release()
    res["after_release_proc_status_delta"] = _delta(proc_status(), st0)
    locked = res["proc_status_delta"].get("VmLck", 0), res["proc_status_delta"].get("VmPin", 0)
    print(f"  pin_memory: {name:<24} {res['gbps_median']:7.2f} GB/s, requested "
          f"{res['requested_bytes'] / GiB:.2f} GiB, VmLck +{locked[0] / GiB:.2f} GiB, "
          f"VmPin +{locked[1] / GiB:.2f} GiB", flush=True)
    return res


def stage_pin_memory(st, dev, scale: float = 1.0, layers: int = 8, repeats: int = 5) -> None:
    """``layers`` 14B-shaped blocks held pageable, by ``pin_memory()`` and by the exact stores."""
    from gpu_stages import _model

    import offload_lab
    from offload_lab import HostMemory
    from offload_lab.planning.planner import pinned_footprint
    from offload_lab.record.runtime.stores import LayerStore

    cuda = dev.type == "cuda"
    model, spec = _model(MODEL, dev, layers=layers, scale=scale)
    plan = offload_lab.plan(spec, tier="pinned", host=HostMemory(available="1TiB"))
    blocks = list(model.blocks)
    stores = [LayerStore.from_module("blocks", i, b, "pinned") for i, b in enumerate(blocks)]
    st.notes["blocks"] = {"count": len(blocks), "store_bytes": [s.nbytes for s in stores],
                          "plan_bytes": [int(b) for b in plan.layers["bytes"]],
                          "predicted_locked_exact": pinned_footprint(plan, "exact"),
                          "predicted_locked_pow2": pinned_footprint(plan, "pow2")}

    def pageable():
        bufs = [_packed(s) for s in stores]
        return bufs, 0, lambda: None

    def torch_pin():
        bufs = [_packed(s) for s in stores]
        if cuda:
            bufs = [{dt: b.pin_memory() for dt, b in d.items()} for d in bufs]
        # what torch's allocator really holds is in its host_memory_stats delta, not counted here
        return bufs, None, _empty_host_cache if cuda else (lambda: None)

    def exact():
        fresh = [LayerStore.from_module("blocks", i, b, "pinned") for i, b in enumerate(blocks)]
        for s in fresh:
            s.host_fill(pin=cuda, file_backed=lambda t: True)  # a store of its own: the model keeps its weights
        bufs = [s.buffers for s in fresh]

        def release() -> None:
            bufs.clear()
            for s in fresh:
                s.restore()  # unregisters the pinned mapping; the parameters were never rebound
        return bufs, sum(s.pinned_bytes for s in fresh), release

    methods: dict[str, Any] = {}
    for name, make in (("pageable", pageable), ("torch pin_memory()", torch_pin), ("exact registered store", exact)):
        methods[name] = measure_method(name, make, dev, repeats)
    st.notes["methods"] = methods
    st.notes["what_each_reports"] = (
        "requested_bytes: the store bytes copied; locked_bytes_counted: what offload-lab counts as "
        "locked (the exact store: its page-rounded registration; None for pin_memory(), whose "
        "blocks torch alone knows: compare its stats delta with predicted_locked_pow2); proc_status_delta: VmLck counts mlock()ed pages, VmPin pages pinned by a driver "
        "(either may stay 0 for CUDA pinning); torch_host_memory_stats_delta: torch's own "
        "accounting of its caching host allocator (empty for the exact stores, which bypass it)")
    if not cuda:
        st.notes["no_cuda"] = "nothing pinned: every buffer is pageable and the GB/s are host-to-host memcpy"
