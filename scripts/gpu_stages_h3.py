"""The ``h3`` evidence stage: MiniMax-H3 at full size at its operating point.

Two groups (``token_refiner.blocks``, 2 blocks; ``blocks``, 50), 35 of the 50 main blocks
resident with the streamed ones spread evenly (``residency="strided"``). Every streamed layer
is written to one safetensors file on local disk (about 21 GB at full size, not the 66 GB
model) and the model's streamed parameters become views of that file's pages, as a real
checkpoint load gives. The plan pins the refiner blocks and every other streamed main block
(an explicit pin order) and is made for a host that can spend exactly those pins: a pin
copied out of a mapping is new anonymous memory, so the planner's own rule keeps the other
streamed layers ``mapped``. Then it measures the startup peak of both init strategies and one
profiled run. Sizes come from the catalog's shapes before anything is allocated; a host, disk
or device too small for them is a skip with a note in ``h3.json``, never an OOM.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = "minimax-h3"
RESIDENT = 35  # of the 50 main blocks: the H3 operating point
GiB = 2**30


def layout(scale: float = 1.0) -> dict[str, Any]:
    """The stage's tiers and sizes from the catalog's shapes (a ``meta`` build: nothing allocated).

    Returns the streamed layers split into ``pinned`` and ``mapped`` (``(group, index)`` pairs),
    ``model_bytes``, ``pinned_bytes``, ``mapped_bytes`` (store bytes of each part) and
    ``file_bytes`` (tensor bytes the checkpoint file holds: every streamed layer's).
    """
    import torch

    import offload_lab
    from offload_lab import HostMemory, catalog, synthetic

    meta_model = synthetic.build(catalog.load(MODEL), scale=scale, dtype=torch.bfloat16, device="meta")
    spec = offload_lab.spec_of(meta_model, name=MODEL)
    p = offload_lab.plan(spec, resident={"blocks": RESIDENT}, residency="strided", host=HostMemory(available="1TiB"))
    main = p.streamed_layers("blocks")
    refiner = [("token_refiner.blocks", i) for i in p.streamed_layers("token_refiner.blocks")]
    pinned = refiner + [("blocks", i) for i in main[::2]]
    mapped = [("blocks", i) for i in main[1::2]]
    nbytes = {(r.group, int(r.layer)): int(r.bytes) for r in p.layers.itertuples()}
    streamed = set(pinned) | set(mapped)
    return {
        "groups": {g.name: g.num_layers for g in spec.groups},
        "pinned": pinned, "mapped": mapped,
        "model_bytes": int(spec.total_bytes),
        "pinned_bytes": sum(nbytes[k] for k in pinned),
        "mapped_bytes": sum(nbytes[k] for k in mapped),
        "file_bytes": sum(p.nbytes for n, p in meta_model.named_parameters() if _layer_of(n) in streamed),
    }


def _layer_of(name: str) -> tuple[str, int] | None:
    for group in ("token_refiner.blocks", "blocks"):
        if name.startswith(group + "."):
            head = name[len(group) + 1:].split(".", 1)[0]
            return (group, int(head)) if head.isdigit() else None
    return None


def tight_host(pin_bytes: int):
    """A hypothetical host whose headroom (available − reserve) is just ``pin_bytes``.

    A plan for it can pin exactly those bytes and afford no anonymous copy of a checkpoint view
    besides, so the planner keeps every unpinned view ``mapped`` (its rule, not an override).
    """
    from offload_lab import HostMemory
    from offload_lab.planning.hostmem import RESERVE_FLOOR

    avail = pin_bytes + RESERVE_FLOOR
    while HostMemory(available=avail).headroom < pin_bytes:  # 5 % beats the floor past ~40 GiB
        avail += pin_bytes - HostMemory(available=avail).headroom
    return HostMemory(available=avail)


def map_layers(model, layers: list[tuple[str, int]], path: Path) -> dict[str, Any]:
    """Write those layers' tensors to ``path`` (safetensors) and make them views of its pages.

    The anonymous originals are dropped as each parameter is rebound, so host memory falls by
    the file's size (its pages are page cache: reclaimable, and what ``mapped`` reads).
    """
    from offload_lab.model.checkpoints import read_checkpoint
    from offload_lab.model.synthetic.checkpoint import _tensors_of, _write_safetensors
    from offload_lab.model.synthetic.weights import set_tensor

    want = set(layers)
    items = [(n, p.detach()) for n, p in model.named_parameters() if _layer_of(n) in want]
    t0 = time.perf_counter()
    _write_safetensors(path, items, {"format": "pt"})  # streams tensor by tensor: no second copy
    written_s = time.perf_counter() - t0
    del items
    count = 0
    for h in read_checkpoint(path):
        for name, view in _tensors_of(h, mmap=True):
            set_tensor(model, name, view)
            count += 1
    gc.collect()
    return {"path": str(path), "bytes": path.stat().st_size, "tensors": count, "write_s": written_s}


def startup_peaks(model, plan, backend: str, inits: tuple[str, ...] = ("grouped", "naive")) -> dict[str, Any]:
    """Enter and leave the manager once per init strategy: measured startup peak vs the planner's."""
    import offload_lab

    out: dict[str, Any] = {}
    for init in inits:
        t0 = time.perf_counter()
        with offload_lab.offload(model, plan, backend=backend, init=init) as mgr:
            pass
        measured, predicted = int(mgr._meta["startup_peak_bytes"]), int(plan.startup_peak(init))
        out[init] = {"measured_bytes": measured, "predicted_bytes": predicted,
                     "error": measured / predicted - 1 if predicted else None,
                     "enter_exit_s": time.perf_counter() - t0}
        print(f"  h3: startup peak {init}: measured {measured / GiB:.2f} GiB, predicted "
              f"{predicted / GiB:.2f} GiB", flush=True)
    return out


def check_plan(plan, lay: dict[str, Any]) -> dict[str, Any]:
    """Tier counts per group; raises when the plan is not the one this stage means to measure."""
    df = plan.layers
    counts = {g: d["tier"].value_counts().to_dict() for g, d in df.groupby("group")}
    tiers = {(r.group, int(r.layer)): r.tier for r in df.itertuples()}
    wrong = [f"{g}.{i} is {tiers[(g, i)]}, meant {want}" for want, keys in (("pinned", lay["pinned"]),
                                                                            ("mapped", lay["mapped"]))
             for g, i in keys if tiers[(g, i)] != want]
    if counts.get("blocks", {}).get("resident") != RESIDENT or wrong:
        raise RuntimeError(f"the H3 plan is not the operating point: tiers {counts}; {wrong[:3]}")
    return counts


def stage_h3(st, dev, scale: float = 1.0, tokens: int | None = None, ckpt_dir: str | os.PathLike | None = None,
             host=None) -> None:
    """MiniMax-H3 (``scale`` 1: ~66 GB bf16) with 35 strided resident, pinned + mapped streamed.

    ``host`` (a :class:`~offload_lab.HostMemory`; ``None`` probes this machine) is what the sizes
    are checked against before anything is built; ``ckpt_dir`` keeps the file (default: a
    temporary directory, removed after).
    """
    import torch
    from gpu_check import fast_build

    import offload_lab
    from offload_lab import HostMemory, catalog, synthetic

    tokens = tokens or (32760 if scale == 1.0 else 64)
    lay = layout(scale)
    host = host or HostMemory.probe()
    # the whole model is built in host memory first; its streamed originals are then replaced
    # by file views and the pins made: counting the pins on top of the model errs on the safe side
    need = lay["model_bytes"] + lay["pinned_bytes"] + host.reserve
    where = Path(ckpt_dir or tempfile.mkdtemp(prefix="h3_ckpt_", dir=os.environ.get("TMPDIR")))
    where.mkdir(parents=True, exist_ok=True)
    disk_free = shutil.disk_usage(where).free
    st.notes["layout"] = {**lay, "pinned": [f"{g}.{i}" for g, i in lay["pinned"]],
                          "mapped": [f"{g}.{i}" for g, i in lay["mapped"]], "scale": scale, "tokens": tokens,
                          "catalog_model_bytes": catalog.load(MODEL).total_bytes}
    st.notes["host_check"] = {"available_bytes": host.available, "needed_bytes": need,
                              "disk_free_bytes": disk_free, "disk_needed_bytes": lay["file_bytes"] + 4 * GiB}
    if host.available < need or disk_free < lay["file_bytes"] + 4 * GiB:
        st.notes["skipped"] = (f"host has {host.available / GiB:.1f} GiB available, the model and its pins "
                               f"need {need / GiB:.1f} GiB; disk has {disk_free / GiB:.1f} GiB free at {where}, "
                               f"the file needs {lay['file_bytes'] / GiB:.1f} GiB + 4 GiB")
        print(f"  h3: skipped: {st.notes['skipped']}", flush=True)
        if ckpt_dir is None:
            shutil.rmtree(where, ignore_errors=True)
        return
    model = None
    try:
        t0 = time.perf_counter()
        model = fast_build(catalog.load(MODEL), dev, **({"scale": scale} if scale != 1.0 else {}))
        st.notes["build_s"] = time.perf_counter() - t0
        st.notes["checkpoint"] = map_layers(model, lay["pinned"] + lay["mapped"], where / "h3-streamed.safetensors")
        spec = offload_lab.spec_of(model, name=MODEL)
        plan_host = tight_host(lay["pinned_bytes"])
        plan = offload_lab.plan(spec, pin_budget=lay["pinned_bytes"], resident={"blocks": RESIDENT},
                                residency="strided", order=[f"{g}.{i}" for g, i in lay["pinned"]],
                                prefetch=1, host=plan_host, tokens=tokens)
        st.notes["plan"] = {"tiers": check_plan(plan, lay), "ledger": plan.ledger, "summary": plan.summary(),
                            "host": f"hypothetical: {plan_host.available} B available, headroom = the pinned "
                                    f"part, so unpinned checkpoint views stay mapped (the real host's "
                                    f"available is in host_check)"}
        inits: tuple[str, ...] = ("grouped", "naive")
        if dev.type == "cuda":
            free = torch.cuda.mem_get_info(dev)[0]
            if free < plan.startup_peak("naive") + 4 * GiB:
                inits = ("grouped",)
                st.notes["naive_skipped"] = (f"device has {free / GiB:.1f} GiB free; naive init would "
                                             f"hold {plan.startup_peak('naive') / GiB:.1f} GiB")
        st.notes["startup_peak"] = startup_peaks(model, plan, st.backend, inits)
        kw = {} if scale == 1.0 else {"text_tokens": 16}  # a dry run stays small
        inputs = synthetic.example_inputs(model, tokens=tokens, device=dev, **kw)
        run = st.measure(f"H3 {RESIDENT} resident strided pinned and mapped p1", model, inputs, plan, tokens)
        st.notes["run"] = {"step_s": run.step_time, "gbps_by_tier": run.layers[run.layers["streamed"]]
                           .groupby("tier")["gbps"].median().to_dict(),
                           "device_peak": run.meta["device_peak"], "pinned_bytes": run.meta["pinned_bytes"]}
    finally:
        del model
        gc.collect()
        if ckpt_dir is None:
            shutil.rmtree(where, ignore_errors=True)
