"""``offload-lab profile`` under ``torchrun``: every rank profiles, rank 0 writes.

``torchrun --nproc-per-node N`` starts N copies of the command with ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` set. :func:`launched` reads them; :func:`session`
joins (or reuses) the process group — ``nccl`` with each rank on GPU ``LOCAL_RANK``, ``gloo``
on the CPU — and only rank 0 prints.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Ranks", "launched", "session", "TIMEOUT_S"]

#: how long a rank waits for the others at a collective before it gives up with an error
TIMEOUT_S = 600


@dataclass(frozen=True)
class Ranks:
    """This process's place in a ``torchrun`` job."""

    rank: int
    local_rank: int
    world_size: int

    @property
    def device(self) -> str:
        return f"cuda:{self.local_rank}"


def launched() -> Ranks | None:
    """The job this process belongs to when ``torchrun`` started several ranks, else ``None``.

    >>> launched() is None or launched().world_size > 1
    True
    """
    env = os.environ
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    if not all(env.get(k, "").isdigit() for k in keys) or int(env["WORLD_SIZE"]) < 2:
        return None
    return Ranks(int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"]))


@contextlib.contextmanager
def session(ranks: Ranks, backend: str) -> Iterator[Ranks]:
    """Join the process group for ``backend`` (``cuda`` → nccl, ``cpu`` → gloo) while inside;
    ranks other than 0 print nothing. A group this function created is destroyed on leaving."""
    import torch
    import torch.distributed as dist

    created = False
    if not dist.is_initialized():
        if backend == "cuda":
            torch.cuda.set_device(ranks.local_rank)
        dist.init_process_group("nccl" if backend == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        created = True
    quiet = contextlib.redirect_stdout(io.StringIO()) if ranks.rank != 0 else contextlib.nullcontext()
    try:
        with quiet:
            yield ranks
    finally:
        if created:
            dist.destroy_process_group()
