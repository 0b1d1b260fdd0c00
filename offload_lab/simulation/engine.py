"""Predict a plan's timeline without running it: :class:`DeviceProfile`, :func:`simulate`, :func:`calibrate`.

The simulator is a discrete-event model of three actors, driven in the order the host thread
acts (every resource is FIFO, so one pass in host order is an exact event simulation):

* the **host thread** runs each layer's pre-hook (``hook_s``), issues copies (``issue_s`` each;
  ``pageable``/``mapped`` copies block it until they finish), launches the block's forward
  (``launch_s``);
* the **copy engine** runs one copy at a time (one host link, shared by the groups' copy
  streams): a copy starts when it is issued, the link is free and everything already launched
  on the compute stream has finished (the copy stream waits on the compute stream at issue);
  it lasts ``copy_latency_s + bytes / tier bandwidth``;
* the **compute stream** runs each layer for its compute time, after the previous layer and
  after the layer's copy (a ``wait`` row covers that gap);
* per group, a **stager** (``staged`` layers): one host memcpy at a time into one of K staging
  buffers (K = prefetch + 1, at most the group's staged layers) at the profile's host memcpy
  rate for ``stage_threads`` threads; a buffer is free again when the device copy that read it
  ends; the device copy of a staged layer then runs at the ``pinned`` rate, and the host
  thread waits for the memcpy before it launches that layer.

``issue`` is the runtime's issue order: ``"before-compute"`` issues prefetches from the
pre-hook and each copy first waits for everything launched on the compute stream;
``"after-compute"`` (the default) issues the copies that do not block the host (pinned, staged)
from the pre-hook too and the host-blocking ones (pageable, mapped) after the block's launch,
and copies wait for no compute (the allocator keeps a freed buffer until its last reader is
done), so a copy that blocks the host overlaps the block just launched; before a copy takes
a device buffer the host waits until the compute that read the buffer it takes over (prefetch
+ 1 copies back) has finished, as the runtime holds it, so a group never has more than
prefetch + 1 layers on the device.

It follows the runtime's semantics: per group,
prefetch depth ``p`` (0 included, capped at ``len(S) - 1``) over the group's streamed layers
``S`` in execution order, wrapping to the next forward; resident layers issue nothing and are
never copied in a step; groups run in declared order, each with its own prefetch; the first
``p`` copies of each group are issued when the manager is armed; the cuda backend synchronises
the device when a step begins and ends (so a wrap-around copy finishes between steps).

``plan.params["sync_after"]`` (absent by default: no sync) names layers after whose forward the
host thread synchronises the compute stream — it waits until every kernel launched so far has
finished before it runs the next hook — as diffusers' group offloading does when it offloads a
group with ``use_stream=True, record_stream=False`` (``current_stream().synchronize()``) or
without streams (a blocking ``.to(offload_device)``): ``{layer group: [layer indices]}``
(:func:`offload_lab.engines.as_plan` sets it). The host can then never queue the next layer
ahead, so every host cost between those layers is exposed on the device.

``compute_mode="sync"`` models the cpu backend instead: the host thread runs each block itself
and its pageable/mapped copies, while one copy-engine thread per group runs pinned copies; work
that overlaps shares the processor by the profile's ``contention`` (1.0: one processor, so
overlap saves nothing) and ``copy_priority`` (who gets it).

A simulated :class:`~offload_lab.record.run.Run` has the same frames as a measured one,
``backend == "sim"`` and ``meta["simulated"] is True``; views show its label with
``(simulated)`` (:func:`~offload_lab.record.run.display_label`); ``meta["evidence"]`` says what
the prediction rests on (:mod:`offload_lab.simulation.evidence`: ``status`` held-out /
unconfirmed / derived, ``band``, ``basis``).

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
>>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
>>> run = simulate(plan, DeviceProfile.load("h200"), steps=2)
>>> run.simulated, run.backend
(True, 'sim')
"""

from __future__ import annotations

import math
import uuid
from collections import Counter, deque
from typing import Any

import pandas as pd

from offload_lab.checks import check_choice, check_int
from offload_lab.model import flops
from offload_lab.model.spec import ModelSpec
from offload_lab.planning.pipeline import PipelinePlan
from offload_lab.planning.planner import Plan
from offload_lab.record.regime import copy_class
from offload_lab.record.run import Run
from offload_lab.simulation.errors import SimError
from offload_lab.simulation.events import COMPUTE, COPY, HOST_BLOCK, STAGE, WAIT, Events
from offload_lab.simulation.layers import Layer, prepare
from offload_lab.simulation.node import derated, node_device, node_run
from offload_lab.simulation.profile import DeviceProfile, default_tokens, names
from offload_lab.simulation.regimes import evidence_of
from offload_lab.vocabulary import ISSUE_ORDERS, TIERS

__all__ = ["simulate", "run_engine", "check_bounds", "sync_points"]


#: Bounds of what a simulation may be asked for. A sampler runs tens to a few thousand steps
#: and a step makes one to a few forwards (classifier-free guidance: 2), so these leave room for
#: any real schedule while refusing a typo such as ``--steps 100000000``, which would build
#: tens of gigabytes of event rows before answering.
MAX_STEPS = 100_000
MAX_PASSES = 64
#: every layer forward adds up to three event rows (copy, host block or wait, compute), about
#: 0.3 KB in the frames: 2 million forwards keep one simulated Run under ~2 GB of memory
MAX_FORWARDS = 2_000_000
#: tokens per forward: today's video DiTs run about 30k (480p) to 75k (720p) tokens, 4k video
#: about 1M; 100M is two orders beyond anything real, and the FLOPs model's seconds grow with
#: the square of it (a 1e23-token forward would last longer than the universe has existed)
MAX_TOKENS = 100_000_000


def simulate(plan: Plan | PipelinePlan, device: DeviceProfile | str | None = None, *, steps: int = 3,
             tokens: int | str | None = None, label: str | None = None, warmup: int = 0,
             passes: int = 1, issue: str | None = None, stage_threads: int = 1,
             ranks_per_node: int = 1, node: Any = None) -> Run:
    """Simulate ``steps`` steps of ``plan`` on ``device`` and return a simulated :class:`Run`.

    ``plan`` is a :class:`~offload_lab.Plan` (it carries its spec; :func:`~offload_lab.plan_of_run`
    rebuilds one from a run) or a :class:`~offload_lab.PipelinePlan` (simulated as its
    :meth:`~offload_lab.PipelinePlan.merged` plan); ``device`` a
    :class:`DeviceProfile` or the name of a shipped one (:func:`names`).
    One step is ``passes`` forwards through every group in declared order (a measured step is
    one call of ``fn``; pass ``passes=spec.meta["guidance_passes"]`` for a denoising step with
    classifier-free guidance). ``tokens`` (an int or a resolution such as ``"480p"``) feeds the
    FLOPs compute model; the first ``warmup`` steps are dropped like a measured run's.
    ``ranks_per_node=k`` predicts each of ``k`` ranks of one node copying at once (pinned
    copies limited by their own links, pageable and mapped staging by the node's shared memory
    bus, ``node``: a :class:`~offload_lab.simulation.node.NodeProfile`, default an estimate) and
    returns them as one multi-rank run (:mod:`offload_lab.simulation.node`).
    ``issue`` (``"after-compute"`` or ``"before-compute"``) and ``stage_threads`` are the
    runtime's options of the same names (see :func:`~offload_lab.offload`); ``issue=None`` takes
    the order of the run a plan was rebuilt from (:func:`plan_of_run`; runs recorded before
        # a plan rebuilt from a run, or another engine's (offload_lab.engines.as_plan), carries its order
        issue = plan.issue or plan.params.get("issue") or "after-compute"

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> plan = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="64GiB"))
    >>> run = simulate(plan, "rtx4090-pcie4", steps=2)
    >>> run.label, run.simulated
    ('rtx4090-pcie4 · 30 pageable · prefetch 1', True)
    >>> simulate(plan, "h200", steps=10**8)
    Traceback (most recent call last):
    ...
    offload_lab.simulation.errors.SimError: steps = 100000000; accepted: an int in [1, 100000]
    """
    if isinstance(ranks_per_node, bool) or ranks_per_node != 1 or node is not None:
        spec, plan, profile = _resolve_call(plan, device)
        profile, node, ranks = node_device(profile, ranks_per_node, node)
        one = simulate(plan, derated(profile, node, ranks), steps=steps, tokens=tokens, warmup=warmup, passes=passes)
        return node_run(one, profile, node, ranks, label)
    spec, plan, profile = _resolve_call(plan, device)
    check_bounds(spec, steps, passes, warmup, tokens)
    if issue is None:
        # a plan rebuilt from a run, or another engine's (offload_lab.engines.as_plan), carries its order
        issue = plan.issue or plan.params.get("issue") or "after-compute"
    _check_issue(issue, stage_threads)
    layers, streamed, prefetch, info, _ = prepare(spec, plan, profile, tokens, stage_threads)
    syncs = sync_points(plan, info)
    run_id = f"sim-{uuid.uuid4().hex[:8]}"
    events, bounds, mem = run_engine(spec, streamed, prefetch, info, profile, steps, passes, run=run_id,
                                      issue=issue, sync_after=syncs)

    tiers = Counter(lay.tier for lay in info.values())
    tier_s = ", ".join(f"{tiers[t]} {t}" for t in TIERS
                       if t in tiers)
    pf = sorted(set(prefetch.values()))
    auto = f"{profile.name} · {tier_s} · prefetch {pf[0] if len(pf) == 1 else pf}"
    label = auto if label is None else str(label)
    params = dict(plan.params or {})
    if plan.ledger:  # a plan rebuilt from a run has none
        params["ledger"] = dict(plan.ledger)
    resident = [lay.nbytes for lay in info.values() if lay.tier == "resident"]
    meta = {
        "run": run_id,
        "label": label,
        "backend": "sim",
        "simulated": True,
        "device_name": profile.name,
        "model": spec.name,
        "model_bytes": int(spec.total_bytes),
        "groups": [g.name for g in spec.groups],
        "plan": params,
        "prefetch": prefetch[spec.groups[0].name] if len(pf) == 1 else prefetch,
        "passes": passes,
        "tokens": tokens,
        # the token count the compute model used (``tokens`` resolved; None: not known), so
        # comparisons pair a default-token prediction with a measured run at that count
        "tokens_used": _tokens_used(spec, profile, tokens),
        "steps": steps,
        "init_strategy": "grouped",
        "init": {"resident_layers": len(resident), "resident_bytes": sum(resident)},
        "profile": profile.to_dict(),
        "issue": issue,
        "stage_threads": stage_threads,
        # what the prediction rests on: the measured runs of its regime, or none
        "evidence": evidence_of(profile, issue, copy_class(info[(g, i)].tier for g in streamed for i in streamed[g])),
    }
    # the engine's frames are built in contract form (simulation/events.py): not re-checked
    return Run.build(events, bounds, layers, memory=mem, meta=meta, warmup=warmup, trusted=True)



def sync_points(plan: Plan, info: dict[tuple[str, int], Layer]) -> frozenset[int]:
    """The layer ids after whose forward the host synchronises the compute stream, from
    ``plan.params["sync_after"]`` (``{layer group: [layer indices]}``; absent or empty: none)."""
    given = (plan.params or {}).get("sync_after")
    if not given:
        return frozenset()
    if not isinstance(given, dict):
        raise SimError(f"plan.params['sync_after'] = {given!r:.80}; accepted: a dict {{layer group: [layer indices]}}")
    out = set()
    for g, idx in given.items():
        for i in idx if isinstance(idx, (list, tuple)) else [idx]:
            lay = info.get((str(g), i)) if isinstance(i, int) and not isinstance(i, bool) else None
            if lay is None:
                raise SimError(f"plan.params['sync_after'] names layer {g!r} {i!r}, which the plan does not "
                               f"have; accepted: a dict {{layer group: [layer indices of the plan]}}")
            out.add(lay.lid)
    return frozenset(out)


def _tokens_used(spec: Any, profile: DeviceProfile, tokens: int | str | None) -> int | None:
    try:
        if tokens is None:
            tokens = profile.tokens if profile.tokens is not None else default_tokens(spec)
        return int(flops.resolve_tokens(spec, tokens))
    except (SimError, flops.FlopsError):
        return None  # a spec that names no token count, with per-layer compute seconds


def _resolve_call(plan: Any, device: Any) -> tuple[ModelSpec, Plan, DeviceProfile]:
    """``(spec, plan, profile)`` checked; a pipeline's plan is its merged plan."""
    if isinstance(plan, PipelinePlan):
        plan = plan.merged()
    if not isinstance(plan, Plan):
        raise SimError(f"plan {type(plan).__name__} is not an offload_lab.Plan; accepted: a Plan from "
                       f"offload_lab.plan(spec, ...) or offload_lab.plan_of_run(run), or a PipelinePlan")
    if device is None:
        raise SimError(f"simulate needs a device: a DeviceProfile or a shipped name {names()}")
    if isinstance(device, str):
        device = DeviceProfile.load(device)
    if not isinstance(device, DeviceProfile):
        raise SimError(f"device {device!r:.80} is not a DeviceProfile; accepted: a DeviceProfile or a "
                       f"shipped name {names()}")
    return plan.spec, plan, device


def _check_issue(issue: Any, stage_threads: Any) -> None:
    check_choice("issue", issue, ISSUE_ORDERS, error=SimError)
    check_int("stage_threads", stage_threads, minimum=1, maximum=64, error=SimError)


def check_bounds(spec: Any, steps: Any, passes: Any, warmup: Any, tokens: Any) -> None:
    """Refuse, in one line, what no real schedule asks for (the bounds say why)."""
    for what, v, lo, hi in (("steps", steps, 1, MAX_STEPS), ("passes", passes, 1, MAX_PASSES),
                            ("warmup", warmup, 0, MAX_STEPS - 1)):
        check_int(what, v, minimum=lo, maximum=hi, error=SimError)
    if warmup >= steps:
        raise SimError(f"warmup = {warmup} drops every one of steps = {steps}; accepted: 0 <= warmup < steps")
    n_layers = sum(g.num_layers for g in spec.groups)
    forwards = steps * passes * max(1, n_layers)
    if forwards > MAX_FORWARDS:
        raise SimError(f"steps × passes × layers = {steps} × {passes} × {n_layers} = {forwards} layer "
                       f"forwards; accepted: at most {MAX_FORWARDS} (fewer steps: step times repeat)")
    if tokens is None:
        return
    if isinstance(tokens, str):
        n = flops.resolve_tokens(spec, tokens)
    else:
        n = tokens
    check_int("tokens", n, minimum=1, maximum=MAX_TOKENS, error=SimError,
              accepted=f"an int in [1, {MAX_TOKENS}] or a resolution name")


class _Walk:
    """What both engines share: the execution order and the runtime's issue rule.

    Copies of a group are numbered ``q = use * len(S) + position in S`` over the run (``use``
    counts forwards); the runtime always issues a prefix of that numbering, so "issue
    everything up to q" is its rule. A group keeps at most ``len(S) - 1`` copies ahead: a
    layer's next use is never issued before its current use is released (the runtime's depth).
    """

    def __init__(self, spec: Any, streamed: dict[str, list[int]], prefetch: dict[str, int],
                 info: dict[tuple[str, int], Layer], passes: int):
        self.groups = [g.name for g in spec.groups]
        self.seq = {g: [info[(g, i)] for i in streamed[g]] for g in self.groups}
        self.depth = {g: min(prefetch[g], max(len(self.seq[g]) - 1, 0)) for g in self.groups}
        self.issued = {g: -1 for g in self.groups}
        self.passes = passes
        self.seen_mapped: set[tuple[str, int]] = set()
        # staging buffers per group, as the runtime sizes them: prefetch + 1, at most the staged layers
        self.buffers = {g: min(prefetch[g] + 1, sum(lay.tier == "staged" for lay in self.seq[g]))
                        for g in self.groups}
        # one forward: (group, layer info, position in S or -1, len(S), depth), groups in declared order
        self.order = []
        for g in spec.groups:
            pos = {i: k for k, i in enumerate(streamed[g.name])}
            for i in range(g.num_layers):
                self.order.append((g.name, info[(g.name, i)], pos.get(i, -1), len(self.seq[g.name]),
                                   self.depth[g.name]))

    def pre_upto(self, g: str, q: int, depth: int, after: bool) -> int:
        """How far a pre-hook issues: ``q + depth`` before-compute; after-compute, the run of
        copies that do not block the host (the runtime defers the first host-blocking one, and
        so, issuing a prefix, everything behind it, to the post-hook)."""
        if not after:
            return q + depth
        S, last = self.seq[g], self.issued[g]
        last = max(last, q)
        while last < q + depth and not S[(last + 1) % len(S)].blocks:
            last += 1
        return last

    def seq_all(self) -> list[Layer]:
        """Every layer of a forward, once."""
        return [lay for _, lay, _, _, _ in self.order]

    def copy_of(self, g: str, q: int) -> tuple[Layer, int, float]:
        """The layer, the step that uses it, and the copy's seconds (cold on a mapped first use)."""
        S = self.seq[g]
        lay = S[q % len(S)]
        dur = lay.copy_warm
        if lay.tier == "mapped" and (g, lay.index) not in self.seen_mapped:
            self.seen_mapped.add((g, lay.index))
            dur = lay.copy_cold
        # the forward (step × passes + pass) it serves: the frame splits it into step and call
        return lay, q // len(S), dur


def run_engine(spec: Any, streamed: dict[str, list[int]], prefetch: dict[str, int],
                info: dict[tuple[str, int], Layer], prof: DeviceProfile, steps: int, passes: int,
                run: str = "", frames: bool = True, issue: str = "after-compute",
                sync_after: frozenset[int] = frozenset()):
    """``(events, bounds, memory)`` frames; with ``frames=False`` only the step bounds (the
    events and memory are None), which is all calibration's step matching reads.
    ``sync_after``: ids of the layers after whose launch the host waits for the compute stream
    (:func:`sync_points`; the cpu backend runs each block on the host, so it is already in sync)."""
    walk = _Walk(spec, streamed, prefetch, info, passes)
    ev = Events(list(info.values()))
    engine = _engine_sync if prof.compute_mode == "sync" else _engine_async
    args = (sync_after,) if sync_after and engine is _engine_async else ()
    bounds = pd.DataFrame(engine(walk, prof, steps, ev, issue == "after-compute", *args),
                          columns=["step", "start_s", "end_s"])
    if not frames:
        return None, bounds, None
    return ev.frame(steps, run, passes), bounds, ev.memory(spec)


def _engine_async(walk: _Walk, prof: DeviceProfile, steps: int, ev: Events,
                  after: bool = True, sync_after: frozenset[int] = frozenset()) -> list[tuple[int, float, float]]:
    """A GPU: the host launches and runs ahead; one link; copies wait on the compute stream.

    The inner loop runs once per layer forward, so it is written for speed: one bound
    ``extend`` per row, ``a if a > b else b`` for ``max`` (same value, no call).
    """
    hook_s, launch_s, issue_s = prof.hook_s, prof.launch_s, prof.issue_s
    head_s, tail_s = prof.step_head_s, prof.step_tail_s
    row, moved = ev.rows.extend, ev.mem.extend
    t = 0.0            # host thread clock
    stream_free = 0.0  # end of the last thing launched on the compute stream
    link_free = 0.0    # the host link, shared by the groups' copy streams
    copy_end: dict[str, dict[int, float]] = {g: {} for g in walk.groups}
    issued, seq, passes, seen = walk.issued, walk.seq, walk.passes, walk.seen_mapped
    stager_free = {g: 0.0 for g in walk.groups}
    held: dict[str, deque] = {g: deque() for g in walk.groups}  # device-copy ends of buffers in use
    stage_end: dict[str, dict[int, float]] = {g: {} for g in walk.groups}
    comp_end: dict[str, dict[int, float]] = {g: {} for g in walk.groups}  # compute end per copy number
    exp = math.exp
    slow, fast, tau = prof.copy_slowdown, prof.idle_speedup, prof.idle_tau_s
    copy_from = 0.0    # start of the last copy on the link (for a block's overlap with it)
    floors = {lay.lid: lay.floor for lay in walk.seq_all()} if slow or fast else {}

    def issue_upto(g: str, last: int) -> None:
        nonlocal t, link_free, copy_from
        S, ends = seq[g], copy_end[g]
        n = len(S)
        q = issued[g]
        done_at, cap = comp_end[g], walk.depth[g] + 1
        while q < last:
            q += 1
            if after:
                # the runtime holds the host until the compute that read the buffer this copy
                # takes over (prefetch + 1 copies back) has finished
                e = done_at.pop(q - cap, None)
                if e is not None and e > t:
                    t = e
            lay = S[q % n]
            dur = lay.copy_warm
            if lay.tier == "mapped" and (g, lay.index) not in seen:
                seen.add((g, lay.index))
                dur = lay.copy_cold
            step = q // n  # the forward it serves (step × passes + pass)
            t += issue_s
            lid = lay.lid
            ready = t
            if lay.stage:
                # a free staging buffer (freed when its last device copy ends), then the memcpy
                s0 = t if t > stager_free[g] else stager_free[g]
                bufs = held[g]
                if len(bufs) >= walk.buffers[g]:
                    free_at = bufs.popleft()
                    s0 = free_at if free_at > s0 else s0
                ready = stager_free[g] = s0 + lay.stage
                stage_end[g][q] = ready
                row((step, lid, STAGE, s0, ready))
            start = ready if ready > link_free else link_free
            if not after and stream_free > start:
                start = stream_free  # before-compute: the copy stream waits on all queued compute
            end = link_free = start + dur
            copy_from = start
            ends[q] = end
            if lay.stage:
                held[g].append(end)
            row((step, lid, COPY, start, end))
            moved((start, lay.nbytes))
            if lay.blocks:
                row((step, lid, HOST_BLOCK, t, end))
                t = end
        issued[g] = q

    for g in walk.groups:  # arm
        issue_upto(g, walk.depth[g] - 1)
    bounds = []
    # per forward position, what the loop reads (no attribute lookups in the loop)
    order = [(g, lay.lid, lay.compute, k, nS, depth, copy_end[g], -lay.nbytes)
             for g, lay, k, nS, depth in walk.order]
    for step in range(steps):
        # the cuda backend synchronises the device before marking a step's start
        t = start_step = max(t, stream_free, link_free)
        t += head_s
        for pss in range(passes):
            use = step * passes + pss
            for g, lid, compute, k, nS, depth, ends, freed in order:
                t += hook_s
                begin = ready = t if t > stream_free else stream_free
                if k >= 0:
                    # pre-hook: this layer's copy if not issued yet, then the next `depth`
                    # streamed layers, wrapping to the next forward (after-compute: the
                    # host-blocking ones after the launch); resident layers issue nothing
                    q = use * nS + k
                    if not after:
                        upto = q + depth
                    else:  # walk.pre_upto, inline: the run of copies that do not block the host
                        upto = issued[g]
                        if upto < q:
                            upto = q
                        S = seq[g]
                        while upto < q + depth and not S[(upto + 1) % nS].blocks:
                            upto += 1
                    if issued[g] < upto:
                        issue_upto(g, upto)
                        begin = ready = t if t > stream_free else stream_free
                    se = stage_end[g].pop(q, None)
                    if se is not None and se > t:  # the host waits until the stager queued the copy
                        t = se
                        begin = ready = t if t > stream_free else stream_free
                    ce = ends.pop(q)
                    if ce > ready:
                        row((use, lid, WAIT, ready, ce))
                        begin = ce
                if floors:
                    floor = floors[lid]
                    rate = compute - floor
                    if rate > 0:
                        # _gpu_block, inline (the idle speed-up, then the copy beside it)
                        idle = begin - stream_free
                        if fast and idle > 0:
                            rate *= 1.0 - fast * (1.0 - exp(-idle / tau))
                        if slow and link_free > begin:
                            over = min(link_free, begin + compute) - max(copy_from, begin)
                            if over > 0:
                                rate *= 1.0 + slow * over / compute
                        compute = floor + rate
                end = stream_free = begin + compute
                row((use, lid, COMPUTE, begin, end))
                t += launch_s
                if sync_after and lid in sync_after and end > t:
                    t = end  # the host synchronises the compute stream (plan.params["sync_after"])
                if k >= 0:
                    moved((end, freed))
                    if after:
                        comp_end[g][q] = end
                    if after and issued[g] < q + depth:
                        issue_upto(g, q + depth)
        # the end marker is recorded on the compute stream after the host's tail work; then
        # the host synchronises the device
        end_step = max(t + tail_s, stream_free)
        bounds.append((step, start_step, end_step))
        t = max(end_step, link_free)
    return bounds


def _gpu_block(compute: float, floor: float, idle: float, begin: float, copy_from: float,
               copy_to: float, slow: float, fast: float, tau: float) -> float:
    """A block's time with the profile's ``copy_slowdown`` and ``idle_speedup``: its rate-bound
    part (above the floor) longer by the fraction of it the last copy overlaps, shorter after
    an idle gap (saturating with the time constant ``tau``)."""
    rate = compute - floor
    if rate <= 0:
        return compute
    if fast and idle > 0:
        rate *= 1.0 - fast * (1.0 - math.exp(-idle / tau))
    if slow and copy_to > begin:
        over = min(copy_to, begin + compute) - max(copy_from, begin)
        if over > 0:
            rate *= 1.0 + slow * over / compute
    return floor + rate


class _SyncEngine:
    """The cpu backend: the host thread runs each block and its pageable/mapped copies itself;
    one copy-engine thread per group runs pinned copies beside it.

    Work that runs at the same time shares the machine: while an engine copy and the host's
    compute or blocking copy overlap, the copy runs at ``1 - contention * (1 - copy_priority)``
    and the host's work at ``1 - contention * copy_priority`` of their own speeds (several
    engines' copies split theirs evenly). Hook overhead and waiting do not compete.
    Thread hand-offs cost ``dispatch_s`` (an idle engine thread picking up a copy) and
    ``wake_s`` (the host resuming after waiting for a copy).
    """

    _EPS = 1e-15

    def __init__(self, walk: _Walk, prof: DeviceProfile, ev: Events, after: bool = True):
        self.walk, self.prof, self.ev, self.after = walk, prof, ev, after
        c = self.c = prof.contention
        # speeds while an engine copy and the host's work overlap
        self.copy_rate, self.host_rate_shared = 1.0 - c * (1.0 - prof.copy_priority), 1.0 - c * prof.copy_priority
        self.t = 0.0
        # per group: FIFO of [q, remaining seconds, start, layer, step]; the head runs from its
        # start (an idle engine thread starts a copy dispatch_s after it is queued; a busy one
        # right after the copy before)
        self.queues: dict[str, list[list]] = {g: [] for g in walk.groups}
        self.done: set[tuple[str, int]] = set()

    def run(self, work: float, compete: bool, until: tuple[str, int] | None = None) -> None:
        """Advance the clock by ``work`` seconds of host work, or until a copy is done."""
        eps, queues, groups = self._EPS, self.queues, self.walk.groups
        while until is not None or work > eps:
            if until is not None and until in self.done:
                return
            t = self.t
            heads = [g for g in groups if queues[g]]
            active = [g for g in heads if queues[g][0][2] <= t + eps]
            later = [queues[g][0][2] for g in heads if queues[g][0][2] > t + eps]
            if not heads and until is not None:
                raise AssertionError(f"waiting on copy {until} that was never issued")
            host = compete and until is None
            rate = (self.copy_rate if host else 1.0) / (1.0 + self.c * (len(active) - 1)) if active else 1.0
            dt = min([queues[g][0][1] / rate if rate > 0 else math.inf for g in active]
                     + [x - t for x in later] or [math.inf])
            if until is None:
                host_rate = self.host_rate_shared if host and active else 1.0
                if host_rate > 0:
                    dt = min(dt, work / host_rate)
                work -= dt * host_rate
            self.t = t = t + dt
            for g in active:
                job = queues[g][0]
                job[1] -= dt * rate
                if job[1] <= eps:
                    queues[g].pop(0)
                    q, _, start, lay, step = job
                    self.done.add((g, q))
                    self.ev.add(step, lay, COPY, start, t)
                    if queues[g]:
                        queues[g][0][2] = t

    def issue_upto(self, g: str, last: int) -> None:
        issued = self.walk.issued
        while issued[g] < last:
            q = issued[g] = issued[g] + 1
            lay, step, dur = self.walk.copy_of(g, q)
            dur += lay.stage  # staged: the stager's memcpy, then the engine's copy, as one job
            self.run(self.prof.issue_s, False)
            self.ev.mem.extend((self.t, lay.nbytes))
            if lay.blocks:
                start = self.t
                self.run(dur, True)
                self.done.add((g, q))
                self.ev.add(step, lay, COPY, start, self.t)
                self.ev.add(step, lay, HOST_BLOCK, start, self.t)
            else:
                queue = self.queues[g]
                queue.append([q, dur, math.inf if queue else self.t + self.prof.dispatch_s, lay, step])

    def steps(self, steps: int) -> list[tuple[int, float, float]]:
        walk, prof, add = self.walk, self.prof, self.ev.add
        for g in walk.groups:
            self.issue_upto(g, walk.depth[g] - 1)
        bounds = []
        for step in range(steps):
            start_step = self.t
            self.run(prof.step_head_s, False)
            for pss in range(walk.passes):
                use = step * walk.passes + pss
                for g, lay, k, nS, depth in walk.order:
                    self.run(prof.hook_s, False)
                    if k >= 0:
                        q = use * nS + k
                        self.issue_upto(g, walk.pre_upto(g, q, depth, self.after))
                        if (g, q) not in self.done:
                            w0 = self.t
                            self.run(0.0, False, until=(g, q))
                            self.run(prof.wake_s, False)  # the waiting host thread is woken
                            add(use, lay, WAIT, w0, self.t)
                        self.done.discard((g, q))
                    begin = self.t
                    self.run(lay.compute, True)
                    add(use, lay, COMPUTE, begin, self.t)
                    if k >= 0:
                        self.ev.mem.extend((self.t, -lay.nbytes))
                        if self.after:
                            self.issue_upto(g, q + depth)
            self.run(prof.step_tail_s, False)
            bounds.append((step, start_step, self.t))
        return bounds


def _engine_sync(walk: _Walk, prof: DeviceProfile, steps: int, ev: Events,
                 after: bool = True) -> list[tuple[int, float, float]]:
    """The cpu backend (see :class:`_SyncEngine`)."""
    return _SyncEngine(walk, prof, ev, after).steps(steps)
