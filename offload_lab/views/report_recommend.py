"""The report's recommendation section: the best plan, the front, the explanation and, when the
recommendation was confirmed, predicted vs measured (plain strings; the template escapes them).

>>> import offload_lab
>>> rec = offload_lab.recommend(offload_lab.catalog.load("wan2.1-t2v-14b"), "rtx4090-pcie4",
...                             host="64GiB", device_memory="24GiB")
>>> d = recommendation_data(rec, None)
>>> d["front"][0]["best"] in ("best", "")
True
"""

from __future__ import annotations

from typing import Any

from offload_lab.simulation.explain import step_text
from offload_lab.units import format_bytes

__all__ = ["recommendation_data", "front_figure"]


def recommendation_data(rec: Any, confirmation: Any) -> dict[str, Any]:
    """What the template shows of a Recommendation (and its Confirmation, if any)."""
    front = []
    for _, r in rec.front.iterrows():
        front.append({
            "id": str(int(r["id"])), "residency": str(r["residency"]), "resident": str(int(r["resident_layers"])),
            "prefetch": str(int(r["prefetch"])), "order": str(r["order"]), "tier": str(r["tier"] or "planner"),
            "step": step_text(float(r["step_s"]), rec.calls_per_step), "pinned": format_bytes(int(r["pinned_bytes"])),
            "peak": format_bytes(int(r["device_peak_bytes"])), "best": "best" if r["best"] else "",
        })
    head = (f"{rec.spec.name} on {rec.profile.name}: device memory {format_bytes(rec.device_memory)}, host "
            f"available {format_bytes(rec.host.available)}; {len(rec.tried)} plans tried, "
            f"{int(rec.tried['fits'].sum())} fit; {rec.calls_per_step} call{'s' if rec.calls_per_step != 1 else ''} "
            f"per step; plans within {rec.tolerance * 100:g} % of the fastest keep the pace")
    conf = []
    if confirmation is not None:
        for _, r in confirmation.table.iterrows():
            conf.append({
                "plan": str(r["plan"]), "predicted": f"{r['predicted_step_s']:.4f} s",
                "measured": f"{r['measured_step_s']:.4f} s ({r['backend']})",
                "ratio": f"×{r['measured_over_predicted']:.2f}",
                "peak_predicted": format_bytes(int(r["predicted_device_peak_bytes"])),
                "peak_measured": format_bytes(int(r["measured_device_peak_bytes"])),
            })
    return {"head": head, "best": rec.best.summary() if rec.best is not None else "nothing fits",
            "explanation": rec.explanation, "front": front, "confirmation": conf}


def front_figure(rec: Any) -> Any:
    """Step time against pinned host bytes of every fitting plan tried, the front highlighted
    and coloured by device peak (simulated step times)."""
    import plotly.graph_objects as go

    t = rec.tried[rec.tried["fits"]]
    fig = go.Figure()
    for name, part, size in (("tried", t[~t["front"]], 7), ("front", t[t["front"]], 12)):
        fig.add_trace(go.Scatter(
            x=part["pinned_bytes"] / 2**30, y=part["step_s"], mode="markers", name=name,
            customdata=part["id"], marker={"size": size, "color": part["device_peak_bytes"] / 2**30,
                                           "colorscale": "Viridis", "showscale": name == "front",
                                           "colorbar": {"title": "device peak GiB"}},
            text=[f"#{int(i)}: {int(k)} resident ({res}), prefetch {int(p)}" for i, k, res, p in
                  zip(part["id"], part["resident_layers"], part["residency"], part["prefetch"])],
            hovertemplate=f"%{{text}}<br>%{{y:.3f}} s/step ({rec.calls_per_step} call"
                          f"{'s' if rec.calls_per_step != 1 else ''}), pinned %{{x:.2f}} GiB<extra></extra>"))
    fig.update_layout(title=f"plans that fit: step time vs pinned host memory (simulated on {rec.profile.name})",
                      xaxis_title="pinned host memory (GiB)", yaxis_title="step (s, simulated)", height=360)
    return fig
