"""How fast, and in how much memory, ``from_torch_profiler`` imports a large Kineto trace, beside HTA.

Writes a synthetic trace of the shape torch.profiler records for layer-wise offload on a GPU
(``ProfilerStep#N`` spans; per block a ``record_function`` label on the CPU and its
``gpu_user_annotation`` on the compute stream; ``aten::`` ops with ``cudaLaunchKernel`` runtime
calls, kernels and ``ac2g`` flow events; prefetch copies for the next block as
``cudaMemcpyAsync`` + ``Memcpy HtoD (Pinned|Pageable -> Device)`` on a copy stream; metadata
rows) once per size and format, as ``rank-0.<format>`` in a directory of its own, then imports
it in a fresh process per size and format. With ``--hta-python`` the same file is also parsed
by Holistic Trace Analysis (``TraceAnalysis(trace_dir=...)``: construction only, which parses
the traces), in a fresh process of that Python, so that neither tool's modules are in the
other's process. Printed per run: CPU seconds and peak RSS of the whole child process (the
kernel's ``wait4`` account), CPU of the import call alone and of importing the module, wall
seconds; then the ratio HTA / offload-lab of the whole processes.

    .venv/bin/python benchmarks/trace_import.py                 # 100 k and 1 M events, .json and .json.gz
    .venv/bin/python benchmarks/trace_import.py --hta-python /tmp/hta-venv/bin/python --formats json.gz
    .venv/bin/python benchmarks/trace_import.py --events 200000 --tracemalloc --json-load

HTA lives in an environment of its own (``python -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip
install HolisticTraceAnalysis``; it does not need torch); without ``--hta-python`` it is skipped
with a message. ``--tracemalloc`` adds the peak of Python allocations during the import (a
slower, separate run); ``--json-load`` adds the naive baseline ``json.load`` of the whole file.
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
print(json.dumps({"seconds": secs, "cpu_s": cpu, "module_cpu_s": t_mod, "base_mb": base / 1024, **info}))
"""

# Holistic Trace Analysis, parse only: constructing TraceAnalysis reads every rank file of the
# directory into its frames (what a user waits for before the first analysis)
_HTA_CHILD = r"""
import logging, resource, sys, time, json
t_mod = time.process_time()
from hta.trace_analysis import TraceAnalysis
t_mod = time.process_time() - t_mod
logging.disable(logging.WARNING)  # HTA logs each parse stage as a warning
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
c = time.process_time()
a = TraceAnalysis(trace_dir=sys.argv[1])
cpu = time.process_time() - c
secs = time.perf_counter() - t
rows = sum(len(df) for df in a.t.traces.values())
print(json.dumps({"seconds": secs, "cpu_s": cpu, "module_cpu_s": t_mod, "base_mb": base / 1024, "rows": rows}))
"""


def _child(cmd: list[str], env: dict) -> dict:
    """Run ``cmd`` in a fresh process; its JSON line plus the kernel's account of the whole process
    (``wait4``: user + system CPU of it and the children it waited for, its peak RSS)."""
    import json

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=tempfile.gettempdir())
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read().decode()
        if p.returncode != 0 or not text.strip():
            tail = err.read().decode(errors="replace").strip().splitlines()[-15:]
            raise SystemExit(f"{cmd[0]} exited with {p.returncode}:\n" + "\n".join(tail))
    r = json.loads(text.strip().splitlines()[-1])
    r.update(process_cpu_s=ru.ru_utime + ru.ru_stime, peak_mb=ru.ru_maxrss / 1024, process_wall_s=wall)
    return r


def _median(runs: list[dict]) -> dict:
    """The run with the median call CPU, with every run's call CPU beside it."""
    runs = sorted(runs, key=lambda r: r["cpu_s"])
    return {**runs[(len(runs) - 1) // 2], "all_cpu_s": [r["cpu_s"] for r in runs]}


def measure(mode: str, path: Path) -> dict:
    """One offload-lab import in a fresh interpreter, so its CPU and peak RSS are its own."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return _child([sys.executable, "-c", _CHILD, mode, str(path)], env)


def measure_hta(python: str, trace_dir: Path) -> dict:
    """One HTA ``TraceAnalysis(trace_dir=...)`` in a fresh interpreter of its own environment."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return _child([python, "-c", _HTA_CHILD, str(trace_dir)], env)


def _versions(hta_python: str | None) -> str:
    from importlib.metadata import version

    try:
        fast = f"msgspec {version('msgspec')}"
    except Exception:  # not installed: every block takes the per-event path
        fast = "no msgspec"
    try:
        fast += f", isal {version('isal')}"
    except Exception:  # not installed: gzip is inflated by zlib
        fast += ", no isal (zlib inflates gzip)"
    ours = f"offload-lab {version('offload-lab')}, pandas {version('pandas')}, numpy {version('numpy')}, " \
           f"{fast}, Python {sys.version.split()[0]}"
    if not hta_python:
        return ours
    code = ("import sys; from importlib.metadata import version as v; print(f\"HolisticTraceAnalysis "
            "{v('HolisticTraceAnalysis')}, pandas {v('pandas')}, numpy {v('numpy')}, Python "
            "{sys.version.split()[0]}\")")
    theirs = subprocess.run([hta_python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return f"{ours}; HTA side: {theirs}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", default="100000,1000000",
                    help="comma list of trace sizes in events (default 100 k and 1 M)")
    ap.add_argument("--dir", default=None, help="where to write the traces (default: a temp dir)")
    ap.add_argument("--formats", default="json,json.gz", help="comma list of json, json.gz")
    ap.add_argument("--hta-python", default=None,
                    help="a Python with HolisticTraceAnalysis installed: also time TraceAnalysis(trace_dir=...) "
                         "on the same files, in its own processes")
    ap.add_argument("--tracemalloc", action="store_true", help="also measure the Python allocation peak")
    ap.add_argument("--json-load", action="store_true", help="also time a whole-file json.load")
    ap.add_argument("--repeat", type=int, default=1,
                    help="fresh processes per tool, size and format; the run with the median call CPU is shown "
                         "(a shared machine's load moves one run by 10-20%% at 100 k events)")
    args = ap.parse_args(argv)
    formats = args.formats.split(",")
    if bad := [f for f in formats if f not in ("json", "json.gz")]:
        ap.error(f"--formats {','.join(bad)}: accepted json, json.gz")
    if args.hta_python and not Path(args.hta_python).exists():
        ap.error(f"--hta-python {args.hta_python!r} does not exist; expected the python of an environment "
                 f"with HolisticTraceAnalysis")
    if not args.hta_python:
        print("HTA skipped: pass --hta-python PATH (a Python with HolisticTraceAnalysis installed) to compare",
              file=sys.stderr)
    load0 = os.getloadavg()
    rows = []
    for events in (int(e) for e in args.events.split(",")):
        with tempfile.TemporaryDirectory(prefix="trace-bench-", dir=args.dir) as tmp:
            for fmt in formats:
                # one directory per format holding one rank file: HTA reads a directory of ranks
                (Path(tmp) / fmt).mkdir()
                path = Path(tmp) / fmt / f"rank-0.{fmt}"
                t = time.perf_counter()
                n = write_trace(path, events)
                size = path.stat().st_size / 2**20
                print(f"wrote {path.name}: {n:,} events, {size:.0f} MiB on disk "
                      f"in {time.perf_counter() - t:.1f} s", file=sys.stderr)
                modes = ["import"] + (["tracemalloc"] if args.tracemalloc else []) + \
                    (["json.load"] if args.json_load else [])
                for mode in modes:
                    rows.append((fmt, "offload-lab", mode, n, size,
                                 _median([measure(mode, path) for _ in range(args.repeat)])))
                if args.hta_python:
                    rows.append((fmt, "HTA", "parse", n, size,
                                 _median([measure_hta(args.hta_python, path.parent) for _ in range(args.repeat)])))
    print(f"\n{'format':8} {'tool':12} {'what':10} {'events':>10} {'file MiB':>9} {'process CPU s':>14} "
          f"{'peak RSS MiB':>13} {'over base':>10} {'call CPU s':>11} {'µs/event':>9} {'module CPU s':>13} {'wall s':>7} "
          f"{'tracemalloc':>12}  rows/steps/layers")
    for fmt, tool, mode, n, size, r in rows:
        tm = f"{r['tracemalloc_peak_mb']:.0f}" if "tracemalloc_peak_mb" in r else "-"
        timed = mode != "tracemalloc"
        cpu = f"{r['cpu_s']:.2f}" if timed else "-"
        secs = f"{r['process_wall_s']:.2f}" if timed else "-"
        per = f"{r['cpu_s'] / n * 1e6:.2f}" if timed else "-"
        shape = f"{r.get('rows', '-')}/{r.get('steps', '-')}/{r.get('layers', '-')}"
        print(f"{fmt:8} {tool:12} {mode:10} {n:>10,} {size:>9.1f} {r['process_cpu_s']:>14.2f} {r['peak_mb']:>13.0f} "
              f"{r['peak_mb'] - r['base_mb']:>10.0f} {cpu:>11} {per:>9} {r['module_cpu_s']:>13.2f} {secs:>7} {tm:>12}  {shape}")
    if args.hta_python:
        # the call alone: from_torch_profiler vs TraceAnalysis(...), with each tool's modules
        # already imported; its memory: peak RSS minus the RSS after those imports
        print("\nHTA / offload-lab, the import call alone (targets: CPU >= 10x, RSS over the imports <= 1/3):")
        ours = {(fmt, n): r for fmt, tool, mode, n, _, r in rows if tool == "offload-lab" and mode == "import"}
        for fmt, tool, _, n, _, r in rows:
            if tool != "HTA":
                continue
            o = ours[(fmt, n)]
            call_x = r["cpu_s"] / o["cpu_s"]
            o_over, h_over = o["peak_mb"] - o["base_mb"], r["peak_mb"] - r["base_mb"]
            rss_share = o_over / h_over if h_over > 0 else float("nan")
            cpu_x, rss_x = r["process_cpu_s"] / o["process_cpu_s"], r["peak_mb"] / o["peak_mb"]
            print(f"  {n:>10,} events {fmt:8} call CPU {o['cpu_s']:.3f} vs {r['cpu_s']:.3f} s = {call_x:5.1f}x "
                  f"({'met' if call_x >= 10 else 'NOT met'}); RSS over imports {o_over:.0f} vs {h_over:.0f} MiB "
                  f"= {rss_share:.2f} ({'met' if rss_share <= 1 / 3 else 'NOT met'}); whole processes: CPU "
                  f"{cpu_x:.1f}x, peak RSS {rss_x:.1f}x")
    if args.repeat > 1:
        print(f"\neach row: the median of {args.repeat} fresh processes by call CPU; every run's call CPU s:")
        for fmt, tool, mode, n, _, r in rows:
            print(f"  {n:>10,} {fmt:8} {tool:12} {mode:10} " + " ".join(f"{x:.3f}" for x in r["all_cpu_s"]))
    # the machine may be shared: the load says how much of its cores these runs had
    print(f"\n{os.cpu_count()} CPUs, load average {load0[0]:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"{_versions(args.hta_python)}")
    print("'process CPU s' / 'peak RSS' = the whole child process (wait4: user + system, max RSS), "
          "'call CPU s' = from_torch_profiler / TraceAnalysis(trace_dir=...) alone, 'module CPU s' = "
          "importing offload_lab.record.kineto / hta.trace_analysis; 'over base' = peak RSS minus the RSS "
          "after those imports")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
