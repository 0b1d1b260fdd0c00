"""The multi-rank GPU checks of ``scripts/gpu_check.py --stage ranks`` (about a minute).

1. **nccl gather**: one rank per visible GPU (``torch.multiprocessing.spawn``, an nccl process
   group) offloads a small synthetic model under its share of the node's host memory with
   ``profile(..., gather=True)``; rank 0 saves the gathered run (``ranks-nccl.zip``, every
   rank's machine facts in its meta) and the check says whether every rank's outputs matched
   its unoffloaded model bit for bit.
2. **host staging**: aggregate GB/s of ``k`` threads (1, 2, 4, 8) each copying its own pageable
   256 MiB tensor to the GPU, and of ``k`` threads doing host memcpys of the same size — the
   ceiling ``NodeProfile.host_memcpy_gbps`` stands for (``node.json``, with the machine facts).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import threading
import time
import traceback
from pathlib import Path

import torch

MIB = 2**20


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, out: str) -> None:
    import datetime

    import torch.distributed as dist

    import offload_lab
    from offload_lab import catalog, synthetic

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    result = {"rank": rank}
    try:
        dev = torch.device("cuda", rank)
        model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.25, layers=6, seed=0)
        inputs = synthetic.example_inputs(model.to(dev), tokens=1024, device=dev)
        with torch.no_grad():
            expected = model(**inputs)
        model.cpu()
        plan = offload_lab.plan(offload_lab.spec_of(model), host=offload_lab.HostMemory.probe())
        outs = []
        run = offload_lab.profile(model, lambda: outs.append(model(**inputs)), plan, steps=2, warmup=1,
                                  backend="cuda", device=dev, gather=True)
        result["identical"] = all(torch.equal(o, expected) for o in outs)
        if run is not None:
            run.save(Path(out) / "ranks-nccl")
            result["gathered_ranks"] = sorted(set(run.events["rank"].tolist()))
    except Exception:
        result["error"] = traceback.format_exc()
    finally:
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))
        dist.destroy_process_group()


def nccl_gather(out: Path, log=print) -> dict:
    import torch.multiprocessing as mp

    world = torch.cuda.device_count()
    mp.spawn(_rank, args=(world, _port(), str(out)), nprocs=world, join=True)
    res = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    log(f"  nccl gather over {world} rank(s): {res}")
    return {"world_size": world, "ranks": res}


def _aggregate_gbps(fns: list, nbytes: int, repeats: int = 4) -> float:
    """GB/s of all ``fns`` (one thread each, each copying ``nbytes`` per call) run at once."""
    barrier = threading.Barrier(len(fns) + 1)

    def work(fn) -> None:
        barrier.wait()
        for _ in range(repeats):
            fn()

    threads = [threading.Thread(target=work, args=(fn,)) for fn in fns]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    return len(fns) * repeats * nbytes / (time.perf_counter() - t0) / 1e9


def _h2d(src: torch.Tensor, dst: torch.Tensor):
    def copy() -> None:
        dst.copy_(src)  # a pageable source: the driver stages it on the calling thread
        torch.cuda.current_stream().synchronize()
    return copy


def _memcpy(src: torch.Tensor, dst: torch.Tensor):
    return lambda: dst.copy_(src)


def host_staging(log=print) -> dict:
    n = 256 * MIB
    rows = []
    dev = torch.device("cuda")
    torch.set_num_threads(1)  # one memcpy per thread, as one staging copy per rank
    for k in (1, 2, 4, 8):
        srcs = [torch.ones(n, dtype=torch.uint8) for _ in range(k)]
        h2d = [_h2d(s, torch.empty(n, dtype=torch.uint8, device=dev)) for s in srcs]
        mem = [_memcpy(s, torch.empty_like(s)) for s in srcs]
        row = {"threads": k, "pageable_h2d_gbps": _aggregate_gbps(h2d, n), "host_memcpy_gbps": _aggregate_gbps(mem, n)}
        rows.append(row)
        log(f"  {k} thread(s): pageable H2D {row['pageable_h2d_gbps']:.2f} GB/s, "
            f"host memcpy {row['host_memcpy_gbps']:.2f} GB/s (aggregate)")
        del srcs, h2d, mem
        torch.cuda.empty_cache()
    return {"rows": rows, "host_memcpy_gbps": max(r["host_memcpy_gbps"] for r in rows)}


def run_stage(out: Path, log=print) -> dict:
    """Both checks; what they measured, with the machine's facts, in ``out/node.json``."""
    import psutil

    facts = {"device_name": torch.cuda.get_device_name(0), "devices": torch.cuda.device_count(),
             "torch_version": torch.__version__, "platform": platform.platform(), "node": platform.node(),
             "cpus": os.cpu_count(), "host_total_bytes": int(psutil.virtual_memory().total),
             "date": time.strftime("%Y-%m-%d", time.gmtime())}
    res: dict = {"machine": facts}
    for name, fn in (("nccl_gather", lambda: nccl_gather(out, log)), ("host_staging", lambda: host_staging(log))):
        try:
            res[name] = fn()
        except Exception:
            res[name] = {"error": traceback.format_exc()}
            log(f"  FAILED {name}:\n{res[name]['error']}")
    (out / "node.json").write_text(json.dumps(res, indent=1))
    return res
