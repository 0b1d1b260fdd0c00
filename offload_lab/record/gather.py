"""Multi-rank runs: each ``torch.distributed`` rank records its own :class:`Run`; :func:`gather`
collects them on rank 0 as one Run with a ``rank`` column in every frame.

Runs travel as the bytes of a saved run (parquet frames and JSON meta in a zip, exactly what
:meth:`Run.save` writes), in ``uint8`` tensors through the process group's own collectives, so
nothing is pickled and the same code runs on ``gloo`` (CPU tensors) and ``nccl`` (CUDA tensors).

Before any run is sent, every rank says whether it has one: a rank whose profile raised calls
:func:`gather` with ``failed=`` its exception (``profile(..., gather=True)`` does), and every
other rank then raises :class:`GatherError` naming it, instead of waiting for bytes that never
come.

:func:`merge_ranks` (also used to import a directory of per-rank traces) does the joining:

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
>>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
>>> one = offload_lab.simulate(plan, "h200", steps=2)
>>> both = merge_ranks([one, one], ranks=[0, 1])
>>> both.steps["rank"].tolist(), both.meta["world_size"]
([0, 0, 1, 1], 2)
"""

from __future__ import annotations

import io
import platform
import uuid
import zipfile
from collections.abc import Sequence
from typing import Any

import pandas as pd

from offload_lab.checks import check_int
from offload_lab.errors import OffloadLabError
from offload_lab.planning.hostmem import local_ranks
from offload_lab.record.run import FRAMES, Run, read_run_frame, read_run_head

__all__ = ["gather", "merge_ranks", "rank_meta", "run_to_bytes", "run_from_bytes", "GatherError", "RANK_KEYS"]

#: per-rank meta entries a gathered run keeps for each rank (``meta["ranks"]``)
RANK_KEYS = ("rank", "local_rank", "world_size", "node", "run", "label", "backend", "device",
             "device_name", "pinned_bytes", "host")
#: bytes of an error message sent along with a failure (longer ones are cut)
_MESSAGE_BYTES = 400


class GatherError(OffloadLabError, RuntimeError):
    """A rank failed, or the ranks' runs cannot be gathered; the message names the rank(s)."""


def rank_meta() -> dict[str, Any]:
    """This process's place in a ``torch.distributed`` job: ``rank``, ``local_rank``,
    ``world_size`` (from an initialised process group, else the ``torchrun`` environment, else a
    single process) and ``node`` (the host name).

    >>> m = rank_meta()
    >>> sorted(m), isinstance(m["node"], str)
    (['local_rank', 'node', 'rank', 'world_size'], True)
    """
    import os

    rank, world = 0, 1
    env = os.environ
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        elif env.get("RANK", "").isdigit() and env.get("WORLD_SIZE", "").isdigit():
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except ImportError:
        pass
    local, _ = local_ranks()
    return {"rank": rank, "local_rank": local if world > 1 else 0, "world_size": world,
            "node": platform.node()}


# -- runs as bytes --------------------------------------------------------------------------
def run_to_bytes(run: Run) -> bytes:
    """The bytes :meth:`Run.save` would write (a zip of parquet frames and JSON meta).

    >>> import offload_lab
    >>> plan = offload_lab.plan(offload_lab.catalog.load("wan2.1-t2v-1.3b"), host="64GiB")
    >>> run = offload_lab.simulate(plan, "h200", steps=1)
    >>> run_from_bytes(run_to_bytes(run)).equals(run)
    True
    """
    buf = io.BytesIO()
    run._write(buf)
    return buf.getvalue()


def run_from_bytes(data: bytes, where: str = "gathered run") -> Run:
    """A :class:`Run` from :func:`run_to_bytes` output, checked as :meth:`Run.load` checks a file."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        head = read_run_head(z, where)
        frames = {n: read_run_frame(z, n, where) for n in FRAMES}
    return Run(**frames, meta=head["meta"])


# -- joining ---------------------------------------------------------------------------------
def merge_ranks(runs: Sequence[Run], ranks: Sequence[int] | None = None, label: str | None = None,
                offsets_s: Sequence[float] | None = None) -> Run:
    """One multi-rank :class:`Run` from one run per rank: every frame gains its ``rank``.

    ``ranks`` defaults to each run's ``meta["rank"]`` (else its position). Each rank's times stay
    on its own clock, from its own origin, unless ``offsets_s`` (one per run) shifts them onto a
    shared one. ``meta["ranks"]`` keeps each rank's :data:`RANK_KEYS` and its plan ledger; the
    rest of meta is rank 0's (the lowest rank's).
    """
    runs = list(runs)
    if not runs or not all(isinstance(r, Run) for r in runs):
        raise GatherError(f"merge_ranks needs one Run per rank; got {[type(r).__name__ for r in runs]!r:.80}")
    if ranks is None:
        ranks = [int(r.meta.get("rank", i)) for i, r in enumerate(runs)]
    ranks = [int(k) for k in ranks]
    if len(ranks) != len(runs) or len(set(ranks)) != len(ranks) or min(ranks) < 0:
        raise GatherError(f"ranks {ranks!r:.80} must be {len(runs)} distinct integers ≥ 0, one per run")
    offsets = [0.0] * len(runs) if offsets_s is None else [float(x) for x in offsets_s]
    if len(offsets) != len(runs):
        raise GatherError(f"offsets_s has {len(offsets)} value(s); expected one per run ({len(runs)})")
    order = sorted(range(len(runs)), key=lambda i: ranks[i])
    runs, ranks, offsets = [runs[i] for i in order], [ranks[i] for i in order], [offsets[i] for i in order]
    run_id = f"ranks-{uuid.uuid4().hex[:8]}"
    frames = {}
    shifted = {"events": ("start_s", "end_s"), "memory": ("t_s",)}
    for name in FRAMES:
        parts = []
        for r, k, off in zip(runs, ranks, offsets):
            df = getattr(r, name).assign(rank=k)
            for col in shifted.get(name, ()) if off else ():
                df[col] = df[col] + off
            parts.append(df)
        frames[name] = pd.concat(parts, ignore_index=True)
    frames["events"]["run"] = run_id
    first = runs[0]
    meta = dict(first.meta)
    meta["run"] = run_id
    meta["world_size"] = max(len(runs), int(meta.get("world_size") or 0), max(ranks) + 1)
    meta["ranks"] = [_one_rank(r, k) for r, k in zip(runs, ranks)]
    meta["nodes"] = sorted({str(m.get("node")) for m in meta["ranks"] if m.get("node")})
    meta["label"] = label or f"{first.label} · {len(runs)} ranks"
    meta["rank"] = None  # the gathered run is every rank's
    return Run(**frames, meta=meta)


def _one_rank(run: Run, rank: int) -> dict[str, Any]:
    out = {k: run.meta[k] for k in RANK_KEYS if k in run.meta}
    out["rank"] = rank
    ledger = (run.meta.get("plan") or {}).get("ledger")
    if ledger:
        out["ledger"] = ledger
    return out


# -- over torch.distributed ------------------------------------------------------------------
def _device(dist: Any, group: Any) -> Any:
    import torch

    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend:  # nccl moves CUDA tensors only
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _encode(text: str) -> list[int]:
    raw = text.encode("utf-8", "replace")[:_MESSAGE_BYTES]
    return list(raw) + [0] * (_MESSAGE_BYTES - len(raw))


def gather(run: Run | None, dst: int = 0, group: Any = None, failed: BaseException | None = None) -> Run | None:
    """Collect every rank's run on rank ``dst`` as one multi-rank :class:`Run`; ``None`` elsewhere.

    Every rank of ``group`` (default: the default process group) must call it. A rank that has
    no run because its work raised passes ``failed=`` the exception: the others then raise
    :class:`GatherError` naming it and its message (it re-raises its own error itself). Outside
    an initialised process group the run is returned as it is.

    >>> import offload_lab
    >>> plan = offload_lab.plan(offload_lab.catalog.load("wan2.1-t2v-1.3b"), host="64GiB")
    >>> run = offload_lab.simulate(plan, "h200", steps=1)
    >>> gather(run) is run   # a single process: nothing to gather
    True
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if failed is not None:
            raise GatherError(f"this process failed ({type(failed).__name__}: {failed})") from failed
        return run
    if failed is None and not isinstance(run, Run):
        raise GatherError(f"gather needs this rank's Run (or failed=the exception); got {type(run).__name__}")
    me, world = dist.get_rank(group), dist.get_world_size(group)
    check_int("dst", dst, minimum=0, maximum=world - 1, error=GatherError, note="a rank of the group")
    dev = _device(dist, group)
    payload = b"" if failed is not None else run_to_bytes(run)
    note = "" if failed is None else f"{type(failed).__name__}: {failed}"
    # one status row per rank: ok flag, payload size, the error message's bytes
    status = torch.tensor([[int(failed is None), len(payload), *_encode(note)]], dtype=torch.int64, device=dev)
    rows = [torch.empty_like(status) for _ in range(world)]
    dist.all_gather(rows, status, group=group)
    table = torch.cat(rows).cpu().tolist()
    bad = [(k, bytes(v for v in row[2:] if v).decode("utf-8", "replace")) for k, row in enumerate(table) if not row[0]]
    if bad:
        if failed is not None:
            return None  # the caller re-raises its own error
        who = "; ".join(f"rank {k} failed ({msg or 'no message'})" for k, msg in bad)
        raise GatherError(f"cannot gather the runs: {who}; rank {me} finished its own run")
    sizes = [row[1] for row in table]
    buf = torch.zeros(max(sizes), dtype=torch.uint8)
    buf[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    buf = buf.to(dev)
    bufs = [torch.empty_like(buf) for _ in range(world)] if me == dst else None
    dist.gather(buf, bufs, dst=dist.get_global_rank(group, dst) if group is not None else dst, group=group)
    if me != dst:
        return None
    runs = [run_from_bytes(bytes(b[:n].cpu().numpy().tobytes()), where=f"rank {k}'s run")
            for k, (b, n) in enumerate(zip(bufs, sizes))]
    return merge_ranks(runs, ranks=list(range(world)))

