"""One rank of the multi-rank tests (started by tests/test_ranks.py in its own process).

Each rank joins a gloo process group, offloads the same small synthetic model under its share
of one node's host budget, checks its own outputs and restore, and writes what it saw as JSON
(``rank<k>.json``) for the test to read; rank 0 also saves the gathered run.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback
from pathlib import Path

TIMEOUT_S = 60


def _setup(rank: int, world: int, port: int):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_WAIT_POLICY="PASSIVE")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    return torch, dist


def _model(torch):
    import offload_lab
    from offload_lab import catalog, synthetic

    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=4, seed=0)
    inputs = synthetic.example_inputs(model, tokens=16)
    with torch.no_grad():
        expected = model(**inputs)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return offload_lab, model, inputs, expected, before


def _restored(model, before) -> bool:
    after = model.state_dict()
    import torch

    return set(after) == set(before) and all(
        after[k].device == before[k].device and torch.equal(after[k], before[k]) for k in before)


def worker(rank: int, world: int, port: int, out: str, node_available: int, fail_rank: int) -> None:
    """Profile under a shared node budget; rank ``fail_rank`` (-1: none) raises in its 2nd step."""
    out = Path(out)
    torch, dist = _setup(rank, world, port)
    result = {"rank": rank, "pid": os.getpid()}
    try:
        offload_lab, model, inputs, expected, before = _model(torch)
        host = offload_lab.HostMemory(available=node_available)  # shared_by: the process group
        plan = offload_lab.plan(offload_lab.spec_of(model), host=host, prefetch=1)
        result.update(ledger=plan.ledger, host_ranks=host.ranks, node_spendable=host.node_spendable)
        outs, calls = [], [0]

        def fn():
            calls[0] += 1
            if rank == fail_rank and calls[0] == 2:
                raise RuntimeError(f"boom on rank {rank}")
            outs.append(model(**inputs))

        try:
            run = offload_lab.profile(model, fn, plan, steps=2, warmup=1, backend="cpu", gather=True)
        except Exception as e:
            result.update(error=f"{type(e).__name__}: {e}")
            run = None
        result.update(identical=[bool(torch.equal(o, expected)) for o in outs],
                      restored=_restored(model, before), gathered=run is not None)
        if run is not None:
            run.save(out / "gathered")
    except BaseException:
        result["crash"] = traceback.format_exc()
    finally:
        (out / f"rank{rank}.json").write_text(json.dumps(result))
        dist.destroy_process_group()


def trace_worker(rank: int, world: int, port: int, out: str) -> None:
    """Record one torch.profiler trace per rank (the profiler writes ``distributedInfo``)."""
    out = Path(out)
    torch, dist = _setup(rank, world, port)
    try:
        from torch.profiler import ProfilerActivity, profile, record_function

        blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))
        x = torch.randn(4, 16)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for step in range(2):
                with record_function(f"ProfilerStep#{step}"):
                    y = x
                    for i, b in enumerate(blocks):
                        with record_function(f"blocks.{i}"):
                            y = b(y)
                    dist.all_reduce(y)
        prof.export_chrome_trace(str(out / f"rank{rank}.trace.json"))
        (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank}))
    except BaseException:
        (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "crash": traceback.format_exc()}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":  # pragma: no cover - started by the tests only
    sys.exit("start this module from tests/test_ranks.py")
