"""How fast, and in how much memory, ``from_torch_profiler`` imports a large Kineto trace.

Writes a synthetic trace of the shape torch.profiler records for layer-wise offload on a GPU
(``ProfilerStep#N`` spans; per block a ``record_function`` label on the CPU and its
``gpu_user_annotation`` on the compute stream; ``aten::`` ops with ``cudaLaunchKernel`` runtime
calls, kernels and ``ac2g`` flow events; prefetch copies for the next block as
``cudaMemcpyAsync`` + ``Memcpy HtoD (Pinned|Pageable -> Device)`` on a copy stream; metadata
rows), then imports it in a fresh process per size and format and prints a table of CPU seconds
(``time.process_time`` of the import call; of importing the module; of the whole process), wall
seconds and peak RSS (``resource.getrusage``: the child's maximum resident set, and that minus
the RSS after ``import offload_lab.record.kineto``).

    .venv/bin/python benchmarks/trace_import.py                 # 100 k and 1 M events, .json and .json.gz
    .venv/bin/python benchmarks/trace_import.py --events 200000 --tracemalloc --json-load

``--tracemalloc`` adds the peak of Python allocations during the import (a slower, separate run);
``--json-load`` adds the naive baseline ``json.load`` of the whole file, for comparison.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_KERNEL = """  {
    "ph": "X",
    "cat": "kernel",
    "name": "%s",
    "pid": 0,
    "tid": 7,
    "ts": %.3f,
    "dur": %.3f
    ,
    "args": {
      "External id": %d, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": %d, "registers per thread": 128, "shared memory": 49152, "blocks per SM": 1.185185, "warps per SM": 9.481482, "grid": [128, 1, 1], "block": [256, 1, 1], "est. achieved occupancy %%": 12
    }
  },
"""
_CPU_OP = """  {
    "ph": "X",
    "cat": "cpu_op",
    "name": "%s",
    "pid": 4242,
    "tid": 4242,
    "ts": %.3f,
    "dur": %.3f
    ,
    "args": {
      "External id": %d, "Record function id": 0, "Sequence number": %d, "Fwd thread id": 0, "Ev Idx": %d
    }
  },
"""
_RUNTIME = """  {
    "ph": "X",
    "cat": "cuda_runtime",
    "name": "%s",
    "pid": 4242,
    "tid": 4242,
    "ts": %.3f,
    "dur": %.3f
    ,
    "args": {
      "External id": %d, "cbid": %d, "correlation": %d
    }
  },
"""
_MEMCPY = """  {
    "ph": "X",
    "cat": "gpu_memcpy",
    "name": "Memcpy HtoD (%s -> Device)",
    "pid": 0,
    "tid": 20,
    "ts": %.3f,
    "dur": %.3f
    ,
    "args": {
      "External id": %d, "device": 0, "context": 1, "stream": 20, "correlation": %d, "bytes": %d, "memory bandwidth (GB/s)": %.6f
    }
  },
"""
_ANN = """  {
    "ph": "X",
    "cat": "%s",
    "name": "%s",
    "pid": %d,
    "tid": %d,
    "ts": %.3f,
    "dur": %.3f
    ,
    "args": {
      "External id": %d, "Record function id": 0, "Ev Idx": %d
    }
  },
"""
_FLOW = """  {
    "ph": "%s", "id": %d, "pid": %s, "tid": %s, "ts": %.3f,
    "cat": "ac2g", "name": "ac2g"%s
  },
"""
_HEAD = """{
  "schemaVersion": 1,
  "deviceProperties": [
    {
      "id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150110011392,
      "computeMajor": 9, "computeMinor": 0,
      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
      "regsPerBlock": 65536, "warpSize": 32,
      "sharedMemPerBlock": 49152, "numSms": 132
    }
  ],
  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
  "displayTimeUnit": "ms",
  "baseTimeNanoseconds": 1700000000000000000,
  "traceEvents": [
  {
    "name": "process_name", "ph": "M", "ts": %.3f, "pid": 4242, "tid": 0,
    "args": {
      "name": "python"
    }
  },
  {
    "name": "process_name", "ph": "M", "ts": %.3f, "pid": 0, "tid": 0,
    "args": {
      "name": "python"
    }
  },
  {
    "name": "thread_name", "ph": "M", "ts": %.3f, "pid": 0, "tid": 7,
    "args": {
      "name": "stream 7"
    }
  },
"""
_TAIL = """  {
    "ph": "X", "cat": "Trace", "ts": %.3f, "dur": %.3f,
    "pid": "Spans", "tid": "PyTorch Profiler",
    "name": "PyTorch Profiler (0)",
    "args": {
      "Op count": 0
    }
  }
],
  "traceName": "synthetic.json"
}
"""

LAYERS = 40
KERNELS = 8
COPIES = 4
PER_LAYER = 3 + 5 * COPIES + 5 * KERNELS   # annotations + copy rows + kernel rows


def write_trace(path: Path, events: int, layers: int = LAYERS) -> int:
    """Write a synthetic Kineto trace with about ``events`` rows; returns the exact count."""
    steps = max(1, round(events / (layers * PER_LAYER + 1)))
    opener = gzip.open(path, "wt", compresslevel=1) if path.suffix == ".gz" else open(path, "w")
    t0 = 1_700_000_000_000_000.0
    n = 3
    with opener as f:
        f.write(_HEAD % (t0, t0, t0))
        corr = 1000
        cpu = t0 + 100.0
        gpu = cpu + 50.0
        cgpu = gpu
        ready: dict[int, float] = {}
        for step in range(steps):
            step_start = cpu
            rows = []
            for i in range(layers):
                # prefetch of the next block (wraps to block 0 for the next step)
                nxt = (i + 1) % layers
                tier = "Pinned" if nxt < layers // 2 else "Pageable"
                pre_start = cpu
                for _ in range(COPIES):
                    corr += 1
                    rdur = 4.0 if tier == "Pinned" else 180.0
                    nbytes = 8 << 20
                    rows.append(_CPU_OP % ("aten::copy_", cpu, rdur + 4.0, corr, corr, corr))
                    rows.append(_RUNTIME % ("cudaMemcpyAsync", cpu + 1.0, rdur, corr, 41, corr))
                    cgpu = max(cgpu, cpu + 2.0)
                    cdur = nbytes / (20e3 if tier == "Pinned" else 10e3)
                    rows.append(_MEMCPY % (tier, cgpu, cdur, corr, corr, nbytes, nbytes / cdur / 1e3))
                    rows.append(_FLOW % ("s", corr, 4242, 4242, cpu + 1.0, ""))
                    rows.append(_FLOW % ("f", corr, 0, 20, cgpu, ', "bp": "e"'))
                    cgpu += cdur
                    cpu += rdur + 6.0
                ready[nxt] = cgpu  # the block's kernels wait for its weights (a stream wait)
                rows.append(_ANN % ("user_annotation", f"prefetch blocks.{nxt}", 4242, 4242, pre_start,
                                    cpu - pre_start, corr, corr))
                lay_start, g_start = cpu, None
                for k in range(KERNELS):
                    corr += 1
                    rows.append(_CPU_OP % ("aten::mm", cpu, 12.0, corr, corr, corr))
                    rows.append(_RUNTIME % ("cudaLaunchKernel", cpu + 3.0, 5.0, corr, 211, corr))
                    gpu = max(gpu, cpu + 20.0, ready.get(i, 0.0))
                    kd = 30.0 + 5.0 * (k % 3)
                    rows.append(_KERNEL % ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
                                           gpu, kd, corr, corr))
                    rows.append(_FLOW % ("s", corr, 4242, 4242, cpu + 3.0, ""))
                    rows.append(_FLOW % ("f", corr, 0, 7, gpu, ', "bp": "e"'))
                    g_start = gpu if g_start is None else g_start
                    gpu += kd + 1.0
                    cpu += 14.0
                rows.append(_ANN % ("user_annotation", f"blocks.{i}", 4242, 4242, lay_start, cpu - lay_start,
                                    corr, corr))
                rows.append(_ANN % ("gpu_user_annotation", f"blocks.{i}", 0, 7, g_start, gpu - g_start,
                                    corr, corr))
            rows.append(_ANN % ("user_annotation", f"ProfilerStep#{step}", 4242, 4242, step_start,
                                cpu - step_start, 0, 0))
            f.write("".join(rows))
            n += len(rows)
            cpu = max(cpu, gpu) + 20.0
        f.write(_TAIL % (t0, cpu - t0))
        n += 1
    return n


_CHILD = r"""
import resource, sys, time, json
t_mod = time.process_time()
import offload_lab.record.kineto as ti
t_mod = time.process_time() - t_mod
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mode, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
c = time.process_time()
if mode == "import":
    run = ti.from_torch_profiler(path)
    info = {"rows": len(run.events), "steps": len(run.steps), "layers": len(run.layers)}
elif mode == "tracemalloc":
    import tracemalloc
    tracemalloc.start()
    run = ti.from_torch_profiler(path)
    info = {"tracemalloc_peak_mb": tracemalloc.get_traced_memory()[1] / 2**20}
    tracemalloc.stop()
else:  # the naive baseline: the whole document in memory
    import gzip
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        doc = json.load(f)
    info = {"rows": len(doc["traceEvents"])}
cpu = time.process_time() - c
secs = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": secs, "cpu_s": cpu, "module_cpu_s": t_mod, "process_cpu_s": ru.ru_utime + ru.ru_stime,
                  "peak_mb": ru.ru_maxrss / 1024, "base_mb": base / 1024, **info}))
"""


def measure(mode: str, path: Path) -> dict:
    """Run one import in a fresh interpreter so its peak RSS is its own."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(path)], capture_output=True,
                         text=True, env=env, check=True)
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", default="100000,1000000",
                    help="comma list of trace sizes in events (default 100 k and 1 M)")
    ap.add_argument("--dir", default=None, help="where to write the traces (default: a temp dir)")
    ap.add_argument("--formats", default="json,json.gz", help="comma list of json, json.gz")
    ap.add_argument("--tracemalloc", action="store_true", help="also measure the Python allocation peak")
    ap.add_argument("--json-load", action="store_true", help="also time a whole-file json.load")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()[0]
    rows = []
    for events in (int(e) for e in args.events.split(",")):
        with tempfile.TemporaryDirectory(prefix="trace-bench-", dir=args.dir) as tmp:
            for fmt in args.formats.split(","):
                path = Path(tmp) / f"synthetic.{fmt}"
                t = time.perf_counter()
                n = write_trace(path, events)
                print(f"wrote {path.name}: {n:,} events, {path.stat().st_size / 2**20:.0f} MiB on disk "
                      f"in {time.perf_counter() - t:.1f} s", file=sys.stderr)
                modes = ["import"] + (["tracemalloc"] if args.tracemalloc else []) + \
                    (["json.load"] if args.json_load else [])
                for mode in modes:
                    r = measure(mode, path)
                    rows.append((fmt, mode, n, path.stat().st_size / 2**20, r))
    print(f"\n{'format':8} {'what':10} {'events':>10} {'file MiB':>9} {'CPU s':>7} {'wall s':>7} "
          f"{'µs/event':>9} {'module CPU s':>13} {'process CPU s':>14} {'peak RSS MiB':>13} {'over base':>10} "
          f"{'tracemalloc':>12}  rows/steps/layers")
    for fmt, mode, n, size, r in rows:
        tm = f"{r['tracemalloc_peak_mb']:.0f}" if "tracemalloc_peak_mb" in r else "-"
        timed = mode != "tracemalloc"
        cpu = f"{r['cpu_s']:.2f}" if timed else "-"
        secs = f"{r['seconds']:.2f}" if timed else "-"
        per = f"{r['cpu_s'] / n * 1e6:.2f}" if timed else "-"
        shape = f"{r.get('rows', '-')}/{r.get('steps', '-')}/{r.get('layers', '-')}"
        print(f"{fmt:8} {mode:10} {n:>10,} {size:>9.0f} {cpu:>7} {secs:>7} {per:>9} {r['module_cpu_s']:>13.2f} "
              f"{r['process_cpu_s']:>14.2f} {r['peak_mb']:>13.0f} {r['peak_mb'] - r['base_mb']:>10.0f} {tm:>12}  "
              f"{shape}")
    # the machine may be shared: the load says how much of its cores these runs had
    print(f"\n{os.cpu_count()} CPUs, load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"'CPU s' = the import call alone, 'module CPU s' = importing offload_lab.record.kineto (numpy, pandas, "
          f"pyarrow), 'process CPU s' = the whole child process; 'over base' = peak RSS minus RSS after "
          f"importing the module")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
