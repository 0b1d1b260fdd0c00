"""The values the report template shows, as plain text: no HTML is made here.

The template (``templates/report.html.j2``) escapes every one of them; these functions only
choose what to say and format numbers through :mod:`offload_lab.views.text`.

>>> ledger_rows({"budget": 2**30, "fits": True})
[{'key': 'pin budget', 'value': '1.00 GiB', 'cls': ''}, {'key': 'fits', 'value': 'yes', 'cls': 'ok'}]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from offload_lab.analysis import summary
from offload_lab.analysis.comparison import why_not_paired
from offload_lab.record.run import Run, display_label
from offload_lab.views.tables import noise_note, order_labels
from offload_lab.views.text import (
    fmt_bytes,
    fmt_number,
    fmt_percent,
    fmt_ratio,
    fmt_seconds,
    fmt_step,
)

_LEDGER_NAMES = [("available", "host available"), ("reserve", "reserve (max(5 %, 2 GiB))"),
                 ("spendable", "spendable"), ("budget", "pin budget"), ("pinned_bytes", "pinned"),
                 ("net_anonymous_bytes", "net new anonymous")]

__all__ = ["engine_rows", "env_row", "ledger_rows", "param_items", "plan_data", "run_rows", "same_plan"]


def _row(key: str, value: Any, cls: str = "") -> dict[str, str]:
    return {"key": key, "value": str(value), "cls": cls}


def _size(x: Any) -> str:
    return fmt_bytes(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else \
        ("–" if x is None else str(x))


def ledger_rows(ledger: Mapping[str, Any]) -> list[dict[str, str]]:
    """Rows of a plan's budget ledger: sizes in binary units, ``fits`` as yes / NO.

    >>> [r["value"] for r in ledger_rows({"spendable": 2**31, "headroom": 2**20, "fits": False})]
    ['2.00 GiB', 'NO', '1.00 MiB']
    """
    rows = [_row(label, _size(ledger[k])) for k, label in _LEDGER_NAMES if k in ledger]
    if "fits" in ledger:
        rows.append(_row("fits", "yes", "ok") if ledger["fits"] else _row("fits", "NO", "bad"))
    # every other number in the ledger is a byte count too (headroom, given_back, ...)
    known = dict(_LEDGER_NAMES)
    staging = ledger.get("staging")
    if isinstance(staging, Mapping) and staging:
        rows.append(_row("staging buffers", "; ".join(
            f"{g}: {v.get('buffers')} × {_size(v.get('buffer_bytes'))}" for g, v in staging.items()
            if isinstance(v, Mapping))))
    rows += [_row(k.replace("_", " "), _size(v)) for k, v in ledger.items()
             if k not in known and k not in ("fits", "staging")]
    return rows


def param_items(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``[("pin budget", "24.00 GiB"), ("resident", "0"), ...]``: plan arguments as text.

    >>> param_items({"pin_budget": 2**30, "order": ["a", "b"], "tier": None})
    [('pin budget', '1.00 GiB'), ('order', 'a, b'), ('tier', '–')]
    """
    out = []
    for k, v in params.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and ("budget" in k or "bytes" in k):
            v = fmt_bytes(v)
        elif isinstance(v, (list, tuple)):
            v = ", ".join(map(str, v)) or "–"
        out.append((k.replace("_", " "), "–" if v is None else str(v)))
    return out


def _profile_name(r: Run) -> str | None:
    p = r.meta.get("profile")
    return str(p.get("name")) if isinstance(p, dict) and p.get("name") else None


def device_text(r: Run) -> str:
    """Where a run ran, as the report shows it: a simulated run's device is a profile, marked so.

    >>> import offload_lab
    >>> p = offload_lab.plan(offload_lab.catalog.load("wan2.1-t2v-1.3b"), host="64GiB")
    >>> device_text(offload_lab.simulate(p, "h200", steps=1))
    'h200 (simulated)'
    """
    name = str(r.meta.get("device_name") or "–")
    return f"{name} (simulated)" if r.simulated and name != "–" else name


def _facts(r: Run, m: dict[str, Any]) -> list[dict[str, str]]:
    gb = ", ".join(f"{t} {v:.3g} GB/s" for t, v in m["gbps"].items()) or "no copies"
    spread = fmt_number(m["spread"], ".2f")
    return [
        _row("backend", f"{r.backend} · {device_text(r)}"),
        _row("tiers", m["tiers"]),
        _row("steps", f"{m['steps']} measured (warm-up dropped: {r.meta.get('warmup_dropped', 0)})"
                      + _calls_text(r)),
        _row("median step", f"{fmt_step(m['step_s'], r.meta)} (compute {fmt_seconds(m['compute_s'])}, "
                            f"copy {fmt_seconds(m['copy_s'])})"),
        _row("slowest / fastest step", f"×{spread}" + (" (noisy)" if m["noisy"] else ""),
             "bad" if m["noisy"] else ""),
        _row("stall / exposed copy", f"{fmt_seconds(m['stall_s'])} / {fmt_seconds(m['exposed_copy_s'])}"),
        _row("overlap", f"{fmt_percent(m['overlap'])} of copy time under compute"),
        _row("bytes per step", fmt_bytes(m["bytes_moved"])),
        _row("copy bandwidth", gb),
        _row("bound", f"{fmt_seconds(m['bound_s'])} ({m['bound']['limit']}-bound) · measured / bound "
                      f"{fmt_number(m['vs_bound'], '.2f')}"),
    ] + _device_peak_rows(r)


def _device_peak_rows(r: Run) -> list[dict[str, str]]:
    """Predicted (the planner's estimate) and measured device peak, when the run recorded both."""
    d = r.meta.get("device_peak")
    if not isinstance(d, dict) or d.get("predicted_bytes") is None:
        return []
    mem = d.get("device_memory")
    of = f" of {fmt_bytes(mem)}" if mem else ""
    if r.backend == "cpu":
        # the cpu backend has no device memory: its number is what it holds as its device, not a
        # peak comparable with the planner's GPU estimate, so the two stand apart
        return [_row("device peak (planner estimate)", f"{fmt_bytes(d['predicted_bytes'])}{of}: what a GPU "
                                                       f"run of this plan would hold"),
                _row("cpu backend holds (measured)", f"{fmt_bytes(d.get('measured_bytes'))}: "
                                                     f"{d.get('measured_how', '')}; not GPU memory")]
    return [_row("device peak", f"predicted {fmt_bytes(d['predicted_bytes'])} (estimate){of} · measured "
                                f"{fmt_bytes(d.get('measured_bytes'))} ({d.get('measured_how', '')})")]


def _calls_text(r: Run) -> str:
    """How many calls of the model each step made, and how steps were found, when that says more
    than one call per step (classifier-free guidance runs the model twice per step)."""
    calls = sorted({int(c) for c in r.steps["calls"]}) if len(r.steps) else []
    how = r.meta.get("steps_from")
    parts = []
    if calls and calls != [1]:
        span = f"{calls[0]}–{calls[-1]}" if len(calls) > 1 else str(calls[0])
        parts.append(f"{span} calls per step")
    if isinstance(how, str) and how != "explicit":
        parts.append(f"steps from {how}")
    return f" · {', '.join(parts)}" if parts else ""


def _bound_text(m: dict[str, Any]) -> str:
    if not math.isfinite(m["vs_bound"]):
        return ""
    b = m["bound"]
    return (f"{fmt_number(m['vs_bound'], '.2f')}× its {b['limit']}-bound of {fmt_seconds(b['bound_s'])} "
            f"(link {fmt_number(b['bandwidth_gbps'])} GB/s, {b['bandwidth_source']})")


def run_rows(runs: list[Run], comparison: pd.DataFrame, metrics: list[dict[str, Any]],
             others: list[Run | None] | None = None) -> list[dict[str, Any]]:
    """Per run, everything the summary, the comparison table and the run's section say.

    ``others`` holds, per run, its plan predicted in the other issue order
    (:func:`offload_lab.simulation.evidence.other_order`, None where there is none): a prediction
    of a plan with pageable, mapped or staged copies is shown under both orders.

    >>> import offload_lab
    >>> from offload_lab.analysis.comparison import compare
    >>> from offload_lab.analysis.summary import metrics
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> runs = [offload_lab.simulate(plan, "h200", steps=2, label="a")]
    >>> row = run_rows(runs, compare(runs), [metrics(r) for r in runs])[0]
    >>> row["label"], row["reference"], row["noise"]
    ('a (simulated)', True, '')
    """
    shown = order_labels(runs)
    out = []
    for i, (r, (_, c), m) in enumerate(zip(runs, comparison.iterrows(), metrics)):
        ratio_ok = bool(not c["ratio_note"] and math.isfinite(c["ratio"]))
        plan_meta = r.meta.get("plan") if isinstance(r.meta.get("plan"), dict) else {}
        led = plan_meta.get("ledger") if isinstance(plan_meta.get("ledger"), dict) else None
        noise = noise_note(r)
        other = others[i] if others is not None and i < len(others) else None
        other_text = "" if other is None else \
            f"{other.meta.get('issue')} order: {fmt_step(other.step_time, other.meta)}"
        out.append({
            "other_order": other_text,
            "label": shown[i], "simulated": r.simulated,
            "evidence": _evidence_row(r), "backend": str(c["backend"]), "tiers": str(c["tiers"]),
            "step": fmt_seconds(c["step_s"]), "stall": fmt_seconds(c["stall_s"]),
            "exposed": fmt_seconds(c["exposed_copy_s"]), "overlap": fmt_percent(c["overlap"]),
            "bound": fmt_seconds(c["bound_s"]), "vs_bound": fmt_number(c["vs_bound"], ".2f"),
            "ratio": fmt_ratio(c["ratio"]) if ratio_ok else "",
            "ratio_to": str(c["ratio_to"]) if ratio_ok else "",
            "reference": ratio_ok and c["ratio_to"] == display_label(r)
            and all(x.label != r.label for x in runs[:i]),
            "ratio_note": str(c["ratio_note"] or ""),
            "note": "; ".join(x for x in (str(c["ratio_note"] or ""), noise and "noisy") if x),
            "noise": noise or "", "bound_text": _bound_text(m), "profile": _profile_name(r),
            "facts": _facts(r, m) + _evidence_facts(r)
            + ([_row("other issue order", f"{other_text} (simulated; {_basis(other)})")] if other is not None else [])
            + _beside(r, runs),
            "plan_params": param_items({k: v for k, v in plan_meta.items() if k not in ("ledger", "warnings")}),
            "plan_ledger": ledger_rows(led) if led else [],
            "env": env_row(r),
        })
    return out


def _evidence_row(r: Run) -> dict[str, str] | None:
    """What a simulated run rests on: its status, band and the sentence naming the runs."""
    ev = r.meta.get("evidence") if r.simulated else None
    if not isinstance(ev, dict):
        return None
    band = ev.get("band")
    status = str(ev.get("status", "–"))
    head = f"{status} ± {band * 100:.1f} %" if isinstance(band, (int, float)) and status == "held-out" else status
    cls = "ok" if status == "held-out" else "bad"
    return {"status": status, "head": head, "basis": str(ev.get("basis", "")), "cls": cls}


def _basis(r: Run) -> str:
    ev = r.meta.get("evidence")
    return str(ev.get("basis", "")) if isinstance(ev, dict) else "no evidence recorded"


def _evidence_facts(r: Run) -> list[dict[str, str]]:
    e = _evidence_row(r)
    return [] if e is None else [_row("evidence", f"{e['head']} — {e['basis']}", e["cls"])]


def same_plan(a: Run, b: Run) -> bool:
    """Whether two runs ran the same plan of the same model (the tier of every layer, prefetch).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> same_plan(offload_lab.simulate(plan, "h200", steps=1), offload_lab.simulate(plan, "h200", steps=2))
    True
    """
    la, lb = a.layers, b.layers
    return (a.meta.get("model") == b.meta.get("model") and len(la) == len(lb)
            and list(la["tier"].astype(str)) == list(lb["tier"].astype(str))
            and a.meta.get("prefetch") == b.meta.get("prefetch"))


def _beside(r: Run, runs: list[Run]) -> list[dict[str, str]]:
    """A simulated run's measured twin in the report, or the reverse: "predicted vs measured"
    only between runs of the same device, model, token count, issue order and plan; a run of
    the same plan that differs in one of those is named, with why no ratio is given."""
    others = [x for x in runs if x.simulated != r.simulated]
    if not others:
        return []

    def why(x: Run) -> str | None:
        return why_not_paired(r, x) if r.simulated else why_not_paired(x, r)

    what = "measured, same plan" if r.simulated else "predicted, same plan"
    twins = [x for x in others if why(x) is None]
    if twins:
        t = twins[0]
        sim, meas = (r, t) if r.simulated else (t, r)
        err = sim.step_time / meas.step_time - 1 if meas.step_time > 0 else math.nan
        return [_row(what, f"{fmt_step(t.step_time, t.meta)} ({display_label(t)}); predicted vs measured "
                           f"{f'{err:+.1%}' if math.isfinite(err) else '–'}")]
    # the same plan elsewhere (another device, tokens or issue order): say why it is not a pair
    near = [(x, why(x)) for x in others if same_plan(x, r)]
    if not near:
        return []
    x, reason = near[0]
    return [_row(what.replace("same plan", "not comparable"),
                 f"{display_label(x)}: {reason} — no predicted-vs-measured ratio (only between runs of the same "
                 f"device, model, token count and issue order)")]


def env_row(r: Run) -> list[str]:
    """The environment table's cells for one run (after its label).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> env_row(offload_lab.simulate(plan, "h200", steps=1))[:2]
    ['sim', 'h200 (simulated)']
    """
    h = r.meta.get("host") if isinstance(r.meta.get("host"), dict) else {}
    host = (f"available {_size(h.get('available'))} of {_size(h.get('total'))}"
            + (f", cgroup {_size(h['cgroup_limit'])}" if h.get("cgroup_limit") else "")
            + (f" ({h.get('source')})" if h.get("source") else "")) if h else "–"
    return [str(r.backend), device_text(r), str(r.meta.get("torch_version") or "–"),
            host, str(r.meta.get("created") or "–"), str(r.meta.get("model") or "–"),
            str(r.meta.get("prefetch", "–")), str(r.meta.get("init_strategy") or "–"),
            # runs recorded before the issue order was an option issued copies before compute
            str(r.meta.get("issue") or "before-compute")]


def plan_data(p: Any, tier_color: Any) -> dict[str, Any]:
    """The plan section: ledger rows, init order and prefetch, arguments, one row per layer.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> p = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> d = plan_data(p, lambda tier: "#000")
    >>> len(d["layers"]) == len(p.layers), d["layers"][0]["tier"]
    (True, 'pinned')
    """
    led = getattr(p, "ledger", {}) or {}
    extra = []
    order = getattr(p, "init_order", None)
    if order:
        extra.append(("init order", " → ".join(map(str, order))))
    if getattr(p, "prefetch", None) is not None:
        extra.append(("prefetch", str(p.prefetch)))
    params = getattr(p, "params", None)
    layers = []
    for row in p.layers.itertuples(index=False):
        rank = getattr(row, "pin_rank", None)
        layers.append({"group": row.group, "layer": row.layer, "tier": row.tier,
                       "color": tier_color(str(row.tier)), "bytes": fmt_bytes(int(row.bytes)),
                       "rank": "–" if rank is None or pd.isna(rank) else int(rank),
                       "reason": getattr(row, "reason", "")})
    return {"ledger": ledger_rows(led), "extra": extra,
            "params": param_items(params) if isinstance(params, Mapping) else [],
            "layers": layers,
            "summary": f"{summary.tier_summary(p.layers)} · pinned {fmt_bytes(led.get('pinned_bytes'))} "
                       f"of budget {fmt_bytes(led.get('budget'))}"}


#: what a row's evidence status means, as the Engines table says it
_ENGINE_EVIDENCE = {"held-out": "held-out: measured runs of its regime back it",
                    "unconfirmed": "unconfirmed: no measured run of its issue order and copies",
                    "derived": "derived: no measured run of this device"}


def engine_rows(frame: pd.DataFrame) -> list[dict[str, str]]:
    """The Engines table: one row of :func:`offload_lab.engines.compare`'s frame each, as text
    (engine, settings, simulated step with its evidence, pinned bytes really locked, device
    peak, fits and why not).

    >>> import pandas as pd
    >>> row = engine_rows(pd.DataFrame([{"engine": "offload-lab", "settings": "defaults", "step_s": 0.61,
    ...     "extra_s": 0.0, "evidence": "held-out", "pinned_bytes": 2**30, "device_peak_bytes": 3 * 2**30,
    ...     "host_fits": True, "device_fits": False, "fits": False, "tiers": "30 pinned, prefetch 1"}]))[0]
    >>> row["step"], row["pinned"], row["fits"]
    ('610 ms', '1.00 GiB', 'NO: device')
    """
    out = []
    for r in frame.to_dict("records"):
        why = [w for w, ok in (("host", r.get("host_fits", True)), ("device", r.get("device_fits", True))) if not ok]
        ev = str(r.get("evidence") or "")
        extra = r.get("extra_s") or 0.0
        out.append({"engine": str(r["engine"]), "settings": str(r["settings"]), "tiers": str(r.get("tiers", "")),
                    "step": fmt_seconds(r["step_s"]),
                    "extra": f"incl. {fmt_seconds(extra)} outside the layers" if extra and extra == extra else "",
                    "evidence": ev, "evidence_title": _ENGINE_EVIDENCE.get(ev, ev),
                    "pinned": fmt_bytes(r["pinned_bytes"]), "peak": fmt_bytes(r["device_peak_bytes"]),
                    "fits": "yes" if r["fits"] else "NO" + (f": {', '.join(why)}" if why else ""),
                    "cls": "" if r["fits"] else "bad"})
    return out
