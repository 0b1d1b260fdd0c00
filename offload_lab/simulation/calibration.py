"""Fitting a :class:`~offload_lab.simulation.profile.DeviceProfile` to measured runs."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from offload_lab.checks import is_number
from offload_lab.record.intervals import busy_within, overlap_with_union
from offload_lab.record.run import Run
from offload_lab.simulation import gpu_effects
from offload_lab.simulation.engine import _run_engine
from offload_lab.simulation.errors import SimError
from offload_lab.simulation.layers import _prepare
from offload_lab.simulation.profile import DeviceProfile
from offload_lab.simulation.runs import plan_of_run

__all__ = ["calibrate", "CPU_PRIOR", "contention_prior", "tokens_of", "spec_of_run"]

#: (contention, copy_priority) assumed for a cpu run that cannot show its own: the two take
#: turns and the copy goes first. Fitted on this project's fixture runs (tests/data/runs, a
#: 2-core machine): a block's compute lasts as much longer as the copy beside it ran, while the
#: copy keeps its speed (a memcpy thread takes the memory bandwidth a small-batch block needs).
CPU_PRIOR = (1.0, 1.0)


def calibrate(run: Run | list[Run], name: str | None = None, contention: float | None = None,
              copy_priority: float | None = None, tokens: int | None = None,
              match_steps: bool = True, effects_from: list[Run] | None = None,
              prior: tuple[float, float] | None = None) -> DeviceProfile:
    """Fit a :class:`DeviceProfile` to a measured run, or to several runs of one model and machine.

    - **Bandwidth** per tier: the median of ``bytes / seconds`` over its copies; ``mapped_cold``
      from each mapped layer's first copy when a run starts at the manager's first step (warm-up
      usually drops it). A mapped layer's non-view bytes are credited to the pageable rate when
      the runs have one.
    - **Compute**: each layer's median forward time (``compute_s["group.layer"]``).
    - **Host**: ``hook_s`` is the median gap between consecutive computes that is neither a host
      block nor a wait; ``step_head_s`` the step's wall time outside its layers; on cpu runs,
      ``dispatch_s`` (a queued copy's start after the host began waiting for it) and ``wake_s``
      (the host resuming after the copy ended), medians over the waits.
    - **Steps** (``match_steps``, default on): what the parts leave unexplained of the median
      step (non-layer work, interpreter pauses, scheduling noise) is added to ``step_head_s``, so
      the profile reproduces the median step of the runs it was fitted on.
    - **Blocking**: whether pageable / mapped copies left ``host_block`` rows.
    - **Contention** (cpu runs, ``compute_mode="sync"``): a copy-engine thread and the host's
      work share the machine. How much longer the host's work lasts per second of overlap with
      an engine copy (``contention * copy_priority``), and the copy per second of overlap with
      the host's work (``contention * (1 - copy_priority)``), are fitted from the same layer
      seen both alone and overlapped (e.g. a prefetch-0 and a prefetch-1 run passed together).
      A side without that contrast takes ``prior`` (``(contention, copy_priority)``, default
      :data:`CPU_PRIOR`; :func:`contention_prior` fits one on other runs); ``contention`` given
      here (with ``copy_priority``, else the prior's) overrides both sides. Durations are de-rated to what
      each takes alone.

    ``provenance`` is ``measured`` with the backend, device, creation time and label of the runs.
    ``tokens`` (default: the runs' ``meta["tokens"]``) is the video token count the runs used, so
    that :func:`simulate` can scale the per-layer seconds to other token counts by FLOPs.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> sim = offload_lab.simulate(plan, "h200", steps=3)
    >>> fit = calibrate(sim)
    >>> fit.provenance["kind"], round(offload_lab.simulate(plan, fit, steps=3).step_time / sim.step_time, 6)
    ('measured', 1.0)

    - **Compute curve** (``compute_curve``): per group, ``floor_s + FLOPs / tflops`` fitted by
      least squares to every layer's median compute against its FLOPs (from the spec the run
      carries in its meta) at the runs' token counts. Runs at two or more token counts fit the
      launch/latency floor and the saturated rate; one token count fits the rate alone (floor 0).
      With runs at several token counts, per-layer ``compute_s`` and the step matching come from
      the runs at ``tokens`` (default: the most common count), bandwidths from all of them.
      ``compute_s`` also keeps each group's median under the group's name, so a profile fitted
      on a truncated model (a few layers at full width) predicts every layer of the full one.

    Not fitted: ``launch_s`` and ``issue_s`` (folded into ``hook_s``), ``copy_latency_s`` (folded
    into the bandwidths) and ``step_tail_s`` (folded into ``step_head_s``).
    """
    runs, backend, sync = _check_runs(run, contention, copy_priority)
    prior = _check_prior(prior)
    fx = None if sync else _fit_effects(_check_effect_runs(effects_from, runs, backend))
    counts: dict[int | None, int] = {}
    for r in runs:
        counts[tokens_of(r)] = counts.get(tokens_of(r), 0) + 1
    if tokens is None:
        # the most common token count; ties go to the larger (the operating point, not a probe)
        tokens = max(counts, key=lambda t: (counts[t], t or 0))
    at = [r for r in runs if tokens_of(r) in (tokens, None)] or runs
    prof = _calibrate(at, name, contention, copy_priority, tokens, match_steps=False, fx=fx, prior=prior)
    curve = _fit_curve(runs, sync, contention, copy_priority, fx, prior)
    if len(at) < len(runs):
        # bandwidths do not depend on tokens: every run's copies count
        every = _calibrate(runs, name, contention, copy_priority, tokens, match_steps=False, fx=fx, prior=prior)
        prof = prof.replace(bandwidths={**every.bandwidths})
    prof = prof.replace(compute_curve=curve)
    if fx is not None:
        prof = prof.replace(copy_slowdown=fx.copy_slowdown, idle_speedup=fx.idle_speedup, idle_tau_s=fx.idle_tau_s,
                            provenance={**prof.provenance, "gpu_effects": fx.how})
    return _match_steps(prof, at) if match_steps else prof


def tokens_of(run: Run) -> int | None:
    """The video token count a run used (its meta's ``tokens``, or the GPU check's), else None.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> tokens_of(offload_lab.simulate(plan, "h200", steps=1, tokens=1024))
    1024
    """
    t = run.meta.get("tokens") or (run.meta.get("gpu_check") or {}).get("tokens")
    return int(t) if is_number(t) and t > 0 else None


def spec_of_run(run: Run) -> Any:
    """The spec behind a run, for the FLOPs model: the catalog's spec of its ``model`` when the
    run is of that model at full size (its layers and bytes agree; the catalog knows the
    architecture and the text tokens), else the spec the run carries in its meta (``plan_full``,
    e.g. a scaled or truncated model), else None.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> spec_of_run(offload_lab.simulate(plan, "h200", steps=1)).meta["arch"]
    'wan'
    """
    from offload_lab.model import catalog
    from offload_lab.model.spec import ModelSpec

    model = run.meta.get("model")
    if model in catalog.names():
        spec = catalog.load(model)
        if (sum(g.num_layers for g in spec.groups) == len(run.layers)
                and sum(layer.bytes for layer in spec.iter_layers()) == int(run.layers["bytes"].sum())):
            return spec
    d = (run.meta.get("plan_full") or {}).get("spec")
    if isinstance(d, dict):
        try:
            return ModelSpec.from_dict(d)
        except Exception:  # an older or foreign spec layout: no FLOPs for this run
            return None
    return None


def _check_effect_runs(effects_from: Any, runs: list[Run], backend: str) -> list[Run]:
    if effects_from is None:
        return runs
    if not isinstance(effects_from, (list, tuple)) or not effects_from or not all(
            isinstance(r, Run) for r in effects_from):
        raise SimError(f"effects_from = {effects_from!r:.80}; accepted: a non-empty list of offload_lab.Run "
                       f"(runs of any model on the same device) or None (the runs being fitted)")
    other = sorted({r.backend for r in effects_from} - {backend})
    if other:
        raise SimError(f"effects_from has runs on backend(s) {other}; accepted: {backend!r} runs, as fitted")
    return list(effects_from)


def _fit_effects(runs: list[Run]) -> gpu_effects.Effects:
    """``copy_slowdown`` and ``idle_speedup`` of cuda runs (any models; each above its own
    model's floors of a first curve), with those floors."""
    by_model: dict[Any, list[Run]] = {}
    for r in runs:
        by_model.setdefault(r.meta.get("model"), []).append(r)
    floors = {m: {g: c[0] for g, c in _fit_curve(rs, False, None, None).items()} for m, rs in by_model.items()}
    parts = [{**_observe(r, False), "family": f"{r.meta.get('model')}|{tokens_of(r)}",
              "floors": floors[r.meta.get("model")]} for r in runs]
    fx = gpu_effects.fit(parts)
    return dataclasses.replace(fx, floors=tuple(sorted(((str(m), g), f) for m, fl in floors.items()
                                                       for g, f in fl.items())))


def _fit_curve(runs: list[Run], sync: bool, contention: Any, copy_priority: Any,
               fx: gpu_effects.Effects | None = None,
               prior: tuple[float, float] = CPU_PRIOR) -> dict[str, list[float]]:
    """``{group: [floor_s, tflops], "*": ...}`` from each layer's median compute against its FLOPs."""
    from offload_lab.model import flops

    pts: dict[str, list[tuple[float, float]]] = {}
    for r in runs:
        spec, tok = spec_of_run(r), tokens_of(r)
        if spec is None or tok is None:
            continue
        part = _observe(r, sync)
        comp_d = _fit_contention(_gather([part]), sync, contention, copy_priority, fx, prior)[0]
        med = pd.Series(comp_d).groupby(pd.MultiIndex.from_tuples(part["comp_key"])).median()
        for (g, i), secs in med.items():
            try:
                fl = flops.layer_flops(spec, g, tok, layer=int(i))
            except Exception:  # a group the spec does not have: no point
                continue
            if fl > 0 and secs > 0:
                pts.setdefault(g, []).append((fl, float(secs)))
    curve = {g: c for g, p in pts.items() if (c := _line(p)) is not None}
    every = _line([x for p in pts.values() for x in p])
    if every is not None:
        curve["*"] = every
    return curve


def _line(pts: list[tuple[float, float]]) -> list[float] | None:
    """``[floor_s, tflops]`` with ``t = floor + F / rate`` by least squares (relative); floor 0 if one F."""
    if not pts:
        return None
    F = np.array([p[0] for p in pts])
    t = np.array([p[1] for p in pts])
    if F.max() >= 1.5 * F.min():
        # weights 1/t: relative errors count, so a launch-bound point is not drowned by a big one
        slope, floor = np.polyfit(F, t, 1, w=1.0 / t)
        if slope > 0 and floor >= 0:
            return [float(floor), float(1.0 / slope / 1e12)]
    # one operating point (or a fit that went negative): a rate through the origin
    slope = float((t * F).sum() / (F * F).sum())
    return [0.0, float(1.0 / slope / 1e12)] if slope > 0 else None


def _calibrate(runs: list[Run], name: str | None, contention: Any, copy_priority: Any,
               tokens: int | None, match_steps: bool, fx: gpu_effects.Effects | None = None,
               prior: tuple[float, float] = CPU_PRIOR) -> DeviceProfile:
    """The fit of one token count's runs (see :func:`calibrate`)."""
    runs, backend, sync = _check_runs(runs, contention, copy_priority)
    parts = [_observe(r, sync) for r in runs]
    cat = _gather(parts)
    comp_d, copy_d, c, prio, how = _fit_contention(cat, sync, contention, copy_priority, fx, prior)
    gaps = [_fit_host_gaps(r.events, r.steps) for r in runs]
    dispatch = np.concatenate([p["dispatch"] for p in parts])
    wake = np.concatenate([p["wake"] for p in parts])
    block_tiers = set().union(*(p["block_tiers"] for p in parts))
    copy_tiers = set(cat["copy_tier"].tolist())
    labels = [r.label for r in runs]
    prof = DeviceProfile(
        name=name or f"calibrated-{backend}",
        bandwidths=_fit_bandwidths(cat, copy_d),
        hook_s=float(np.median([g[0] for g in gaps])),
        step_head_s=float(np.median([g[1] for g in gaps])),
        dispatch_s=float(np.median(dispatch)) if sync and len(dispatch) else 0.0,
        wake_s=float(np.median(wake)) if sync and len(wake) else 0.0,
        host_memcpy_gbps=_fit_host_memcpy(runs),
        pageable_blocks_host=("pageable" in block_tiers) if "pageable" in copy_tiers else True,
        mapped_blocks_host=("mapped" in block_tiers) if "mapped" in copy_tiers else True,
        compute_s=_fit_compute(cat, comp_d),
        tokens=tokens,
        compute_mode="sync" if sync else "async",
        contention=float(c),
        copy_priority=float(prio),
        provenance={"kind": "measured", "backend": backend,
                    "machine": runs[0].meta.get("device_name") or backend,
                    "date": max(str(r.meta.get("created", "")) for r in runs) or None,
                    "runs": [r.meta.get("run") for r in runs], "labels": labels,
                    "steps": int(sum(len(r.steps) for r in runs)),
                    "contention": how},
        notes=f"calibrated from {', '.join(repr(x) for x in labels)}",
    )
    return _match_steps(prof, runs) if match_steps else prof


def _check_prior(prior: Any) -> tuple[float, float]:
    if prior is None:
        return CPU_PRIOR
    ok = (isinstance(prior, (tuple, list)) and len(prior) == 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in prior))
    if not ok:
        raise SimError(f"prior {prior!r:.80}; accepted: (contention, copy_priority), each in [0, 1], or None")
    return float(prior[0]), float(prior[1])


def contention_prior(runs: list[Run]) -> tuple[tuple[float, float], str]:
    """A ``(contention, copy_priority)`` prior fitted on ``runs`` alone, and how: the medians
    over every pair of them that fits both sides (two runs of one plan at prefetch 0 and 1
    usually do, where the whole set may not agree), else an even split ``(0.5, 0.5)`` that no
    run decided. For a held-out fit, whose prior must not come from the run it predicts
    (:data:`CPU_PRIOR` was fitted on this project's fixture runs).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> contention_prior([offload_lab.simulate(plan, "h200", steps=2)])
    ((0.5, 0.5), 'even split (no pair of the runs shows both sides)')
    """
    import itertools

    got = []
    for a, b in itertools.combinations(runs, 2):
        if a.backend != b.backend or a.meta.get("model") != b.meta.get("model"):
            continue
        try:
            p = calibrate([a, b], match_steps=False)
        except SimError:
            continue
        if p.compute_mode == "sync" and p.provenance.get("contention") == "fitted":
            got.append((p.contention, p.copy_priority))
    if not got:
        return (0.5, 0.5), "even split (no pair of the runs shows both sides)"
    return ((float(np.median([g[0] for g in got])), float(np.median([g[1] for g in got]))),
            f"median of {len(got)} pair{'s' if len(got) != 1 else ''} of the training runs")


def _check_runs(run: Any, contention: Any, copy_priority: Any) -> tuple[list[Run], str, bool]:
    """The runs to fit, their backend, and whether they ran in sync mode (cpu backend)."""
    runs = [run] if isinstance(run, Run) else list(run) if isinstance(run, (list, tuple)) else None
    if not runs or not all(isinstance(r, Run) for r in runs):
        raise SimError(f"calibrate needs an offload_lab.Run or a non-empty list of them, got {run!r:.80}")
    backends = {r.backend for r in runs}
    models = {r.meta.get("model") for r in runs}
    if len(backends) > 1 or len(models) > 1:
        raise SimError(f"calibrate takes runs of one model on one backend; got backends {sorted(backends)} "
                       f"and models {sorted(map(str, models))}")
    backend = runs[0].backend
    sim_prof = runs[0].meta.get("profile") or {}
    sync = backend == "cpu" or (backend == "sim" and sim_prof.get("compute_mode") == "sync")
    if not sync and (contention or copy_priority is not None):
        raise SimError(f"contention = {contention!r}, copy_priority = {copy_priority!r} for a {backend!r} "
                       f"run; both are modelled for cpu runs only (leave them None)")
    if contention is None and copy_priority is not None:
        raise SimError(f"copy_priority = {copy_priority!r} without contention; pass contention= too "
                       f"(a number in [0, 1]), or neither to fit both from the runs")
    return runs, backend, sync


def _fit_host_memcpy(runs: list[Run]) -> float | None:
    """One thread's host memcpy GB/s: the median of the ``stage`` rows' bytes / seconds, divided
    by the threads that shared each memcpy (``meta["stage_threads"]``); None without stage rows.

    The ceiling of several threads is not fitted from one thread count; it stays unknown.
    """
    rates = []
    for r in runs:
        st = r.events[(r.events["kind"] == "stage") & (r.events["dur_s"] > 0)]
        threads = max(int(r.meta.get("stage_threads", 1) or 1), 1)
        rates.extend((st["bytes"] / st["dur_s"] / 1e9 / threads).tolist())
    return float(np.median(rates)) if rates else None


def _gather(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' observations (:func:`_observe`) concatenated, computes keyed by (run, step)."""
    cat = {k: np.concatenate([p[k] for p in parts]) for k in ("comp_d", "comp_o", "comp_ov", "comp_idle",
                                                              "copy_d", "copy_o",
                                                              "copy_bytes", "copy_mb", "copy_first",
                                                              "copy_engine")}
    cat["comp_key"] = [k for p in parts for k in p["comp_key"]]
    cat["model"] = parts[0]["model"]  # calibrate fits one model's runs
    # (run, step) of each compute, as one number
    cat["comp_step"] = np.concatenate([p["comp_step"] + n * 1_000_000 for n, p in enumerate(parts)])
    cat["copy_key"] = [k for p in parts for k in p["copy_key"]]
    cat["copy_tier"] = np.concatenate([p["copy_tier"] for p in parts])
    return cat


def _fit_contention(cat: dict[str, Any], sync: bool, contention: float | None, copy_priority: float | None,
                    fx: gpu_effects.Effects | None = None,
                    prior: tuple[float, float] = CPU_PRIOR) -> tuple[np.ndarray, np.ndarray, float, float, str]:
    """Compute and copy durations de-rated to what each takes alone, ``contention``,
    ``copy_priority`` and how they were found (sync mode; async runs' computes lose the
    fitted GPU effects ``fx`` instead, their copies keep theirs)."""
    comp_d, copy_d = cat["comp_d"], cat["copy_d"]
    if not sync:
        if fx is not None:
            comp_d = gpu_effects.derate(comp_d, [g for g, _ in cat["comp_key"]], cat["comp_ov"],
                                        cat["comp_idle"], fx, cat["model"])
        return comp_d, copy_d, 0.0, 0.5, "none"
    eng = cat["copy_engine"]
    if contention is not None:
        c = float(contention)
        prio = float(copy_priority) if copy_priority is not None else prior[1]
        s_h, s_k, how = c * prio, c * (1.0 - prio), "given"
    else:
        # how much longer the host's work (computes, blocking copies) and the engine's copies
        # last per second of overlap with each other
        s_h = _fit_stretch(np.concatenate([comp_d, copy_d[~eng]]),
                           np.concatenate([cat["comp_o"], cat["copy_o"][~eng]]),
                           [("c",) + k for k in cat["comp_key"]]
                           + [("b",) + k for k, e in zip(cat["copy_key"], eng) if not e])
        s_k = _fit_stretch(copy_d[eng], cat["copy_o"][eng], [k for k, e in zip(cat["copy_key"], eng) if e])
        fitted = [n for n, v in (("host", s_h), ("copy", s_k)) if v is not None]
        how = ("fitted" if len(fitted) == 2 else f"{fitted[0]} side fitted, other prior" if fitted
               else "prior (no run shows the same layer both alone and overlapped)")
        s_h = s_h if s_h is not None else prior[0] * prior[1]
        s_k = s_k if s_k is not None else prior[0] * (1.0 - prior[1])
        c = min(1.0, s_h + s_k)
        prio = s_h / (s_h + s_k) if s_h + s_k > 0 else 0.5
    comp_d = comp_d - s_h * cat["comp_o"]
    copy_d = copy_d - np.where(eng, s_k, s_h) * cat["copy_o"]
    return comp_d, copy_d, c, prio, how


def _fit_bandwidths(cat: dict[str, Any], copy_d: np.ndarray) -> dict[str, float]:
    """GB/s per tier: medians of bytes / seconds; mapped split into warm and cold copies."""
    bandwidths: dict[str, float] = {}
    tiers = cat["copy_tier"]
    nbytes = cat["copy_bytes"]
    gbps = nbytes / np.maximum(copy_d, 1e-12) / 1e9
    for tier in ("pinned", "pageable"):
        # a staged layer's device copy reads a pinned staging buffer: it is a pinned copy
        sel = (tiers == tier) | (tiers == "staged") if tier == "pinned" else tiers == tier
        if sel.any():
            bandwidths[tier] = float(np.median(gbps[sel]))
    msel = tiers == "mapped"
    if msel.any():
        mb = cat["copy_mb"][msel]
        secs = copy_d[msel]
        if "pageable" in bandwidths:
            secs = secs - (nbytes[msel] - mb) / (bandwidths["pageable"] * 1e9)
        else:
            mb = nbytes[msel]  # no pageable rate known: credit the whole copy to the mapped rate
        rate = mb / np.maximum(secs, 1e-12) / 1e9
        first = cat["copy_first"][msel]
        if first.any() and (~first).any():
            bandwidths["mapped_warm"] = float(np.median(rate[~first]))
            bandwidths["mapped_cold"] = float(np.median(rate[first]))
        else:
            bandwidths["mapped_warm"] = float(np.median(rate))
    return bandwidths


def _fit_compute(cat: dict[str, Any], comp_d: np.ndarray) -> dict[str, float]:
    """Seconds per forward of each ``"group.layer"``, and each group's median under its name."""
    names_ = [f"{g}.{i}" for g, i in cat["comp_key"]]
    per_layer = pd.Series(comp_d).groupby(names_).median()
    # medians per layer miss what a disturbed step spreads over all its layers; scale them so a
    # step's compute adds up to the median step's (1.0 on a quiet run)
    per_step = pd.Series(comp_d).groupby(cat["comp_step"]).sum()
    typical = pd.Series(per_layer.reindex(names_).to_numpy()).groupby(cat["comp_step"]).sum()
    k = float(np.median(per_step.to_numpy() / typical.to_numpy())) if float(typical.min()) > 0 else 1.0
    out = {str(name_): max(0.0, float(v) * k) for name_, v in per_layer.items()}
    groups = pd.Series(list(out.values())).groupby([n.rsplit(".", 1)[0] for n in out]).median()
    return {**{str(g): float(v) for g, v in groups.items()}, **out}


def _median_step(spec: Any, plan: Any, prof: DeviceProfile, steps: int, warmup: int, passes: int,
                 span: bool = False) -> float | tuple[float, float]:
    """``simulate(...).step_time`` without building the Run (calibration loops on it); with
    ``span``, also the median span of a step's layers (first compute start to last compute end)."""
    _, streamed, prefetch, info, _ = _prepare(spec, plan, prof, None)
    ev, bounds, _ = _run_engine(spec, streamed, prefetch, info, prof, steps, passes, frames=span,
                                issue=plan.issue or "after-compute")
    kept = bounds.iloc[warmup:]
    step = float((kept["end_s"] - kept["start_s"]).median())
    if not span:
        return step
    comp = ev[(ev["kind"] == "compute") & (ev["step"] >= warmup)]
    return step, _median_span(comp)


def _median_span(comp: pd.DataFrame) -> float:
    """Median over steps of (last compute end - first compute start)."""
    if not len(comp):
        return 0.0
    g = comp.groupby("step")
    return float((g["end_s"].max() - g["start_s"].min()).median())


def _match_steps(prof: DeviceProfile, runs: list[Run]) -> DeviceProfile:
    """Put what the model leaves unexplained of the runs' median step into the host costs.

    The other fits explain a step from its parts; time they miss (non-layer work, interpreter
    pauses, a shared machine's scheduling) is still paid. The residual is split where the runs
    show it: what the simulated span of a step's layers (first compute start to last compute
    end) misses of the measured span is paid per layer forward (``hook_s``, sync mode: there the
    host thread runs every layer), the rest once per step (``step_head_s``). So the profile reproduces the median steps it was fitted on, and a
    profile fitted on a truncated model carries its per-layer costs to the full depth. A few
    rounds, since in sync mode host time also lets a copy thread progress.
    """
    for _ in range(6):
        resid, inside, per_layer = [], [], []
        for r in runs:
            spec, plan = plan_of_run(r)
            warm = int(r.meta.get("warmup_dropped", 0) or 0)
            passes = _passes_of(r)
            got, span = _median_step(spec, plan, prof, steps=len(r.steps) + warm, warmup=warm,
                                     passes=passes, span=True)
            ev = r.events
            resid.append(r.step_time - got)
            inside.append(_median_span(ev[ev["kind"] == "compute"]) - span)
            per_layer.append(max(1, len(r.layers) * passes - 1))
        # async (a GPU): the host runs ahead of the device, so host time per layer does not
        # lengthen the layers' span; the whole residual stays per step
        d_in = float(np.median([i / n for i, n in zip(inside, per_layer)])) if prof.compute_mode == "sync" else 0.0
        hook = max(0.0, prof.hook_s + d_in)
        d_out = float(np.median(resid)) - (hook - prof.hook_s) * float(np.median(per_layer))
        head = max(0.0, prof.step_head_s + d_out)
        tol = 1e-4 * max(r.step_time for r in runs)
        if abs(head - prof.step_head_s) <= tol and abs(hook - prof.hook_s) * float(np.median(per_layer)) <= tol:
            break
        prof = prof.replace(step_head_s=head, hook_s=hook)
    return prof


def _passes_of(run: Run) -> int:
    """Forwards per step, as the run shows them (each layer computes twice in a CFG step).

    Step matching must simulate the same number, or the missing forwards would be booked as
    per-step head time and counted again when the profile is simulated with ``passes``.
    """
    comp = run.events[run.events["kind"] == "compute"]
    if not len(comp):
        return 1
    return max(1, int(round(comp.groupby(["step", "group", "layer"]).size().median())))


def _observe(run: Run, sync: bool) -> dict[str, Any]:
    """One run's compute and copy durations, how long each overlapped competing work, and keys."""
    ev = run.events
    if not len(ev) or not len(run.steps):
        raise SimError(f"run {run.label!r} has no events or no measured steps to calibrate from")
    kinds = ev["kind"].astype(str).to_numpy()
    comp = ev[kinds == "compute"]
    if not len(comp):
        raise SimError(f"run {run.label!r} has no compute rows to calibrate from")
    copies = ev[(kinds == "copy") & (ev["dur_s"].to_numpy() > 0)]
    blocks = ev[kinds == "host_block"]
    blocked = set(zip(blocks["step"], blocks["group"], blocks["layer"]))
    on_engine = np.array([k not in blocked for k in zip(copies["step"], copies["group"], copies["layer"])],
                         dtype=bool)
    if sync:
        # a copy-engine copy competes with the host's computes and blocking copies, and they with it
        eng = copies[on_engine]
        o_comp = _overlap(comp, eng)
        o_copy = np.where(on_engine, _overlap(copies, pd.concat([comp, blocks])), _overlap(copies, eng))
    else:
        o_comp, o_copy = np.zeros(len(comp)), np.zeros(len(copies))
    gpu = gpu_effects.observe(run) if not sync else {"ov": np.zeros(len(comp)), "idle": np.zeros(len(comp))}
    mb_of = {(str(g), int(i)): int(b) for g, i, b in
             zip(run.layers["group"], run.layers["layer"], run.layers["mapped_bytes"])}
    nbytes = copies["bytes"].to_numpy().astype("float64")
    mb = np.array([mb_of.get((str(g), int(i)), 0) for g, i in zip(copies["group"], copies["layer"])],
                  dtype="float64")
    mb = np.where(mb > 0, np.minimum(mb, nbytes), nbytes)
    # a mapped layer's first copy faults its pages in only when the run starts at the first step
    from_start = int(run.meta.get("warmup_dropped", 0) or 0) == 0
    first = (~copies.duplicated(["group", "layer"], keep="first")).to_numpy() & from_start
    dispatch, wake = _handoffs(ev, copies[on_engine]) if sync else (np.zeros(0), np.zeros(0))
    return {
        "dispatch": dispatch, "wake": wake, "model": run.meta.get("model"),
        "comp_d": comp["dur_s"].to_numpy(dtype="float64"), "comp_o": o_comp,
        "comp_ov": gpu["ov"], "comp_idle": gpu["idle"],
        "comp_key": list(zip(comp["group"].astype(str), comp["layer"].astype(int))),
        "comp_step": comp["step"].to_numpy(dtype="int64"),
        "copy_d": copies["dur_s"].to_numpy(dtype="float64"), "copy_o": o_copy,
        "copy_key": list(zip(copies["group"].astype(str), copies["layer"].astype(int))),
        "copy_tier": copies["tier"].astype(str).to_numpy(), "copy_bytes": nbytes, "copy_mb": mb,
        "copy_engine": on_engine,
        "copy_first": first, "block_tiers": set(blocks["tier"].astype(str)),
    }


def _handoffs(ev: pd.DataFrame, eng: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Thread hand-off times around the waits for engine copies (cpu backend), one per step.

    ``dispatch``: from the host starting to wait to its copy starting, when the engine thread
    was idle (its previous copy had ended before the wait began). ``wake``: from the copy's end
    to the end of the wait. Each is averaged within a step (the caller takes the median over
    steps), since a step's time adds its hand-offs up and their tail is long on a busy machine.
    """
    waits = ev[ev["kind"] == "wait"]
    if not len(waits) or not len(eng):
        return np.zeros(0), np.zeros(0)
    keys = ["step", "group", "layer"]
    e = eng[keys + ["start_s", "end_s"]].sort_values("start_s").copy()
    e["prev_end"] = e.groupby("group")["end_s"].shift(1).fillna(-np.inf)
    m = waits[keys + ["start_s", "end_s"]].merge(e, on=keys, suffixes=("_w", "_c"))
    waited = m["end_s_c"] > m["start_s_w"]
    idle = waited & (m["prev_end"] <= m["start_s_w"]) & (m["start_s_c"] >= m["start_s_w"])
    # a step pays the sum of its hand-offs: the median over steps of their per-step mean
    dispatch = (m["start_s_c"] - m["start_s_w"])[idle].groupby(m["step"][idle]).mean().to_numpy()
    wake = (m["end_s_w"] - m["end_s_c"])[waited].clip(lower=0).groupby(m["step"][waited]).mean().to_numpy()
    return dispatch, wake


def _overlap(q: pd.DataFrame, ref: pd.DataFrame) -> np.ndarray:
    """For each interval of ``q``, how long it overlaps the union of ``ref``'s intervals."""
    return overlap_with_union(q["start_s"].to_numpy(dtype="float64"), q["end_s"].to_numpy(dtype="float64"),
                              ref["start_s"].to_numpy(dtype="float64"), ref["end_s"].to_numpy(dtype="float64"))


def _fit_stretch(d: np.ndarray, o: np.ndarray, keys: list[tuple]) -> float | None:
    """How much longer an interval lasts per second it overlapped competing work; None if unseen.

    Per key (one layer's computes, or its copies) seen at least twice nearly alone (overlap
    under 10 % of its typical length) and twice well overlapped (over half): (median overlapped
    length − median alone length) / median overlap. The answer is the median over such keys,
    needing 8 intervals in all and keys that agree (interquartile range under 0.3); anything
    less is noise, and the caller's prior is better. Medians, not a regression on the overlap:
    a copy that ran entirely inside a compute overlapped for exactly as long as it lasted, so
    its noise would pass for contention.
    """
    df = pd.DataFrame({"d": d, "o": o, "k": [hash(k) for k in keys]})
    if len(df) < 8:
        return None
    df["med"] = df.groupby("k")["d"].transform("median")
    per_key, used = [], 0
    for _, g in df.groupby("k"):
        alone, over = g[g["o"] <= 0.1 * g["med"]], g[g["o"] >= 0.5 * g["med"]]
        if len(alone) >= 2 and len(over) >= 2:
            per_key.append((over["d"].median() - alone["d"].median()) / over["o"].median())
            used += len(alone) + len(over)
    if used < 8:
        return None
    q1, q3 = np.percentile(per_key, [25, 75])
    if q3 - q1 > 0.3:
        return None
    return float(min(max(np.median(per_key), 0.0), 1.0))


def _fit_host_gaps(ev: pd.DataFrame, steps: pd.DataFrame) -> tuple[float, float]:
    """Per-layer host overhead and per-step host time outside the layers, from the events.

    Between two consecutive computes of a step, what is not a host block or a wait is the next
    layer's hook/issue/launch overhead (``hook_s``: the median over steps of a step's mean). A Run keeps each step's wall
    time but not its start, so the time outside the layers is ``wall - (last compute end - first
    compute start)`` less what the first layer's pre-hook spent blocked or waiting (the busy time
    in that window just before the first compute); it is all put in ``step_head_s``.
    """
    busy_ev = ev[ev["kind"].isin(("host_block", "wait"))]
    b_s = busy_ev["start_s"].to_numpy()
    b_e = busy_ev["end_s"].to_numpy()
    busy_all = list(zip(b_s.tolist(), b_e.tolist()))
    comp = ev[ev["kind"] == "compute"]
    gaps: list[float] = []
    outside: list[float] = []
    wall = dict(zip(steps["step"].astype(int), steps["wall_s"].astype(float)))
    for s, c in comp.groupby("step", sort=True):
        if int(s) not in wall:
            continue
        starts = np.sort(c["start_s"].to_numpy())
        ends = np.sort(c["end_s"].to_numpy())
        c0, c1 = float(starts[0]), float(ends[-1])
        w = wall[int(s)] - (c1 - c0)
        pairs = sorted(zip(c["start_s"].tolist(), c["end_s"].tolist()))
        near = [(a, b) for a, b in busy_all if b > c0 - w and a < c1]
        step_gaps = [max(0.0, s1 - e0 - _busy_within(near, e0, s1))
                     for (_, e0), (s1, _) in zip(pairs, pairs[1:])]
        if step_gaps:
            gaps.append(float(np.mean(step_gaps)))
        outside.append(w - _busy_within(near, c0 - w, c0))
    hook = float(np.median(gaps)) if gaps else 0.0
    head = max(0.0, float(np.median(outside)) - hook) if outside else 0.0
    return hook, head


def _busy_within(busy: list[tuple[float, float]], a: float, b: float) -> float:
    """Length of the union of ``busy`` intervals inside ``[a, b]``."""
    return busy_within([s for s, _ in busy], [e for _, e in busy], a, b)
