"""Every engine over a small grid of its own settings, simulated side by side: :func:`compare`,
and its figure, :func:`figure` (a pure function of the frame).

A row's ``step_s`` is the simulated steady step (``calls`` forwards) plus ``extra_s``: the copies
the engine makes outside the layers (diffusers' unmatched group at every forward, a whole
component per pipeline call spread over the spec's default steps, the per-tensor latency of
leaf-level copies), priced by the same device profile. ``pinned_bytes`` is what the engine's
pins really lock (torch's caching host allocator rounds each block up to a power of two);
``evidence`` is the simulated run's ``meta["evidence"]["status"]``.
"""

from __future__ import annotations

import html
import math
import warnings
from typing import TYPE_CHECKING, Any

import pandas as pd

from offload_lab.engines.errors import EngineError
from offload_lab.engines.plans import ENGINES, as_plan, pinned_bytes
from offload_lab.model.spec import ModelSpec
from offload_lab.planning.errors import PlanError, PlanWarning
from offload_lab.planning.planner import Plan
from offload_lab.simulation.engine import simulate
from offload_lab.simulation.profile import DeviceProfile
from offload_lab.simulation.recommend import recommend
from offload_lab.units import format_bytes

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["COLUMNS", "GRID", "grid", "compare", "figure", "settings_text", "extra_seconds", "step_seconds", "text"]

COLUMNS = ["engine", "settings", "step_s", "extra_s", "evidence", "pinned_bytes", "device_peak_bytes",
           "host_fits", "device_fits", "fits", "tiers"]
#: the settings each engine is simulated under; ``"recommended"`` is offload-lab's recommend()
GRID: list[tuple[str, Any]] = [
    ("diffusers-group", {"use_stream": True}),
    ("diffusers-group", {"use_stream": True, "record_stream": True, "low_cpu_mem_usage": True}),
    ("diffusers-group", {}),
    ("diffusers-group", {"num_blocks_per_group": 2}),
    ("diffusers-group", {"offload_type": "leaf_level", "use_stream": True}),
    ("diffusers-group", {"offload_to_disk_path": "offload"}),
    ("diffusers-model", {"mode": "model"}),
    ("diffusers-model", {"mode": "sequential"}),
    ("sglang-layerwise", {"pin_cpu_memory": True}),
    ("sglang-layerwise", {"pin_cpu_memory": True, "dit_offload_prefetch_size": 2}),
    ("sglang-layerwise", {}),
    ("offload-lab", {}),
    ("offload-lab", "recommended"),
]


def grid(engines: Any = None) -> list[tuple[str, Any]]:
    """The ``(engine, settings)`` pairs :func:`compare` simulates, for ``engines`` (default all).

    >>> [s for e, s in grid(["sglang-layerwise"])][:2]
    [{'pin_cpu_memory': True}, {'pin_cpu_memory': True, 'dit_offload_prefetch_size': 2}]
    """
    if engines is None:
        return list(GRID)
    wanted = [engines] if isinstance(engines, str) else list(engines)
    bad = [e for e in wanted if e not in ENGINES]
    if bad:
        raise EngineError(f"engine {bad[0]!r} is not one of {', '.join(ENGINES)}")
    return [(e, s) for e, s in GRID if e in wanted]


def settings_text(engine: str, settings: Any) -> str:
    """The settings that differ from the engine's defaults, as ``key=value`` (``defaults``).

    >>> settings_text("diffusers-group", {"use_stream": True, "non_blocking": False})
    'use_stream=True'
    """
    if isinstance(settings, str):
        return settings
    base = ENGINES[engine]
    diff = [f"{k}={v!r}" for k, v in settings.items() if base.get(k) != v]
    return ", ".join(diff) or "defaults"


def extra_seconds(p: Plan, profile: DeviceProfile, calls: int = 1) -> float:
    """Seconds per step of the copies an engine plan makes outside its layers (see the module)."""
    info = (p.params or {}).get("engine") or {}
    steps = int(p.spec.meta.get("default_steps", 50) or 50)
    total = 0.0
    for e in info.get("extra_copies", []):
        tier = e["tier"]
        s = profile.copy_seconds(tier, int(e["bytes"]), int(e["bytes"]) if tier == "mapped" else 0) if e["bytes"] else 0.0
        s += int(e.get("copies", 0)) * profile.copy_latency_s
        total += s * (calls if e["per"] == "call" else 1 / steps)
    return total


def step_seconds(p: Plan, profile: DeviceProfile, tokens: Any = None, calls: int = 1) -> tuple[float, str]:
    """``(steady simulated step seconds, evidence status)`` of a plan, extra copies excluded."""
    run = simulate(p, profile, steps=2, warmup=1, tokens=tokens, passes=calls)
    return float(run.steps["wall_s"].mean()), str(run.meta["evidence"]["status"])


def _profile(device: Any) -> DeviceProfile:
    if isinstance(device, DeviceProfile):
        return device
    if isinstance(device, str) and device in DeviceProfile.names():
        return DeviceProfile.load(device)
    raise EngineError(f"device {device!r:.80} is not a DeviceProfile nor one of {', '.join(DeviceProfile.names())}")


def _row(engine: str, settings: Any, p: Plan | None, profile: DeviceProfile, tokens: Any, calls: int) -> dict:
    if p is None:  # recommend found nothing that fits
        return {"engine": engine, "settings": settings_text(engine, settings), "step_s": math.nan, "extra_s": 0.0,
                "evidence": "", "pinned_bytes": 0, "device_peak_bytes": 0, "host_fits": False,
                "device_fits": False, "fits": False, "tiers": "nothing fits"}
    step, evidence = step_seconds(p, profile, tokens, calls)
    extra = extra_seconds(p, profile, calls)
    led = p.ledger
    host_fits, dev_fits = bool(led["fits"]), bool(led.get("device_fits", True))
    tiers = ", ".join(f"{n} {t}" for t, n in p.tier_counts.items() if n)
    return {"engine": engine, "settings": settings_text(engine, settings), "step_s": step + extra, "extra_s": extra,
            "evidence": evidence, "pinned_bytes": pinned_bytes(p), "device_peak_bytes": int(p.device_peak),
            "host_fits": host_fits, "device_fits": dev_fits, "fits": host_fits and dev_fits,
            "tiers": f"{tiers}, prefetch {p.prefetch}"}


def compare(spec: ModelSpec, device: DeviceProfile | str = "rtx4090-pcie4", host: Any = None,
            device_memory: int | str | None = None, tokens: int | str | None = None, calls: int = 1,
            engines: Any = None) -> pd.DataFrame:
    """Simulate every engine of :func:`grid` (or ``engines``) on ``device`` with ``host``;
    one row per engine setting, columns :data:`COLUMNS` (bytes as ints, ``step_s`` per step of
    ``calls`` forwards). ``device_memory`` defaults to the profile's memory size.

    >>> import offload_lab
    >>> df = compare(offload_lab.catalog.load("wan2.1-t2v-1.3b"), "h200", host="64GiB", engines="sglang-layerwise")
    >>> df[["settings", "evidence", "fits"]].to_dict("records")[0]
    {'settings': 'pin_cpu_memory=True', 'evidence': 'held-out', 'fits': True}
    """
    if not isinstance(spec, ModelSpec):
        raise EngineError(f"spec {spec!r:.80} is not a ModelSpec; accepted: catalog.load(name) or spec_of(model)")
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise EngineError(f"calls {calls!r} is not an int ≥ 1 (forwards per step; 2 with classifier-free guidance)")
    profile = _profile(device)
    mem = device_memory if device_memory is not None else profile.memory_bytes
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)  # a plan that does not fit is a row saying so
        for engine, settings in grid(engines):
            if settings == "recommended":
                try:
                    rec = recommend(spec, profile, host=host, device_memory=mem, tokens=tokens, calls_per_step=calls)
                except PlanError as e:
                    raise EngineError(str(e)) from None
                rows.append(_row(engine, settings, rec.best, profile, tokens, calls))
                continue
            p = as_plan(spec, engine, host=host, device_memory=mem, tokens=tokens, **settings)
            rows.append(_row(engine, settings, p, profile, tokens, calls))
    return pd.DataFrame(rows, columns=COLUMNS)


def text(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with sizes and seconds formatted for a terminal."""
    out = frame.copy()
    for c in ("pinned_bytes", "device_peak_bytes"):
        out[c] = [format_bytes(int(v)) for v in out[c]]
    out["step_s"] = [f"{v:.3f}" if v == v else "—" for v in out["step_s"]]
    out["extra_s"] = [f"{v:.3f}" for v in out["extra_s"]]
    return out.rename(columns={"pinned_bytes": "pinned", "device_peak_bytes": "device peak"})


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=False)


def figure(frame: pd.DataFrame) -> go.Figure:
    """Step time per engine setting (bars, fastest first), coloured by whether it fits; hover
    shows pinned bytes, device peak and evidence. A pure function of :func:`compare`'s frame; its
    strings are escaped before plotly sees them (plotly reads tick and hover text as markup)."""
    import plotly.graph_objects as go  # heavy: plotly

    missing = [c for c in ("engine", "settings", "step_s", "fits", "pinned_bytes", "device_peak_bytes", "evidence")
               if c not in frame.columns]
    if missing:
        raise EngineError(f"frame lacks columns {missing}; accepted: the frame engines.compare() returns")
    df = frame.sort_values("step_s", na_position="last")
    fig = go.Figure()
    for fits, colour, name in ((True, "#2a9d8f", "fits"), (False, "#e76f51", "does not fit")):
        part = df[df["fits"].astype(bool) == fits]
        if part.empty:
            continue
        fig.add_bar(
            x=part["step_s"], y=[_esc(f"{e}: {s}") for e, s in zip(part["engine"], part["settings"])],
            orientation="h",
            name=name, marker_color=colour,
            customdata=list(zip([format_bytes(int(v)) for v in part["pinned_bytes"]],
                                [format_bytes(int(v)) for v in part["device_peak_bytes"]],
                                [_esc(v) for v in part["evidence"]])),
            hovertemplate="%{y}<br>%{x:.3f} s/step<br>pinned %{customdata[0]}<br>device peak %{customdata[1]}"
                          "<br>evidence %{customdata[2]}<extra></extra>")
    fig.update_layout(title="engines' offload settings, simulated", xaxis_title="s per step (simulated)",
                      # every setting labelled (plotly skips category ticks when rows are few and tall labels crowd)
                      yaxis={"autorange": "reversed", "tickmode": "linear", "dtick": 1}, barmode="overlay",
                      height=160 + 28 * len(df))
    return fig
