"""One paragraph on a :class:`~offload_lab.simulation.recommend.Recommendation`: what bounds the
best plan's step and why it beats the runner-ups (every time in it is simulated)."""

from __future__ import annotations

from typing import Any

from offload_lab.planning.device import activation_bytes
from offload_lab.units import format_bytes

__all__ = ["explain", "step_bound"]


def step_bound(timer: Any, plan: Any) -> dict[str, float]:
    """Seconds per step of compute and of streamed copies, and their max (the bound).

    Compute and copies overlap at best, so a step can not be faster than the larger of the two.
    """
    passes = timer.passes
    compute = sum(timer.compute.values()) * passes
    df = plan.layers[plan.layers["streamed"]]
    copy = sum(timer._copy(str(t), int(b), int(m))[0] for t, b, m in zip(df["tier"], df["bytes"], df["mapped_bytes"]))
    copy *= passes
    blocking = sum(timer._copy(str(t), int(b), int(m))[0] for t, b, m in zip(df["tier"], df["bytes"], df["mapped_bytes"])
                   if timer.profile.blocks_host(str(t))) * passes
    return {"compute_s": compute, "copy_s": copy, "blocking_s": blocking, "bound_s": max(compute, copy)}


def _nothing_fits(rec: Any, s: Any) -> str:
    spec = rec.spec
    biggest = max((b for b in s.sizes.values()), default=0)
    need = spec.non_layer_bytes + activation_bytes(spec, rec.tokens) + biggest
    if need > rec.device_memory:
        return (f"No plan fits: even with every layer streamed at prefetch 0 the device holds the "
                f"non-layer weights ({format_bytes(spec.non_layer_bytes)}), the activation estimate "
                f"({format_bytes(activation_bytes(spec, rec.tokens))}) and the largest layer "
                f"({format_bytes(biggest)}): {format_bytes(need)} > device memory "
                f"{format_bytes(rec.device_memory)}. Accepted: a device with more memory or fewer tokens.")
    return (f"No plan fits the host: {len(rec.tried)} plans fit the device "
            f"({format_bytes(rec.device_memory)}) but none fits host available "
            f"{format_bytes(rec.host.available)} − reserve {format_bytes(rec.host.reserve)}.")


def explain(rec: Any, s: Any) -> str:
    """The paragraph: the best, its bound, the runner-ups and what they give up."""
    if rec.best is None:
        return _nothing_fits(rec, s)
    tried = rec.tried
    b = rec.best_row
    bd = step_bound(s.timer, rec.best)
    if bd["copy_s"] > bd["compute_s"]:
        what = (f"copy-bound: its {int((rec.best.layers['streamed']).sum())} streamed layers move "
                f"{format_bytes(int(rec.best.layers.loc[rec.best.layers['streamed'], 'bytes'].sum()) * s.timer.passes)} "
                f"per step, {bd['copy_s']:.3f} s on the link against {bd['compute_s']:.3f} s of compute")
        if bd["blocking_s"] > 0:
            what += f", {bd['blocking_s']:.3f} s of it in copies that block the host"
    elif bd["copy_s"] > 0:
        what = (f"compute-bound: {bd['compute_s']:.3f} s of compute hides {bd['copy_s']:.3f} s of copies")
    else:
        what = f"compute-bound with nothing streamed: {bd['compute_s']:.3f} s of compute"
    text = (f"Best of {len(tried)} plans ({int(tried['fits'].sum())} fit host and device): "
            f"{int(b['resident_layers'])} layers resident ({b['residency']}), prefetch {int(b['prefetch'])}, "
            f"{format_bytes(int(b['pinned_bytes']))} pinned, device peak "
            f"{format_bytes(int(b['device_peak_bytes']))} (estimate) of {format_bytes(rec.device_memory)}, "
            f"{b['step_s']:.3f} s per step (simulated; bound {bd['bound_s']:.3f} s), {what}.")
    others = tried[tried["fits"] & ~tried["best"]].sort_values("step_s")
    seen = set()
    ups = []
    for _, r in others.iterrows():
        key = (r["residency"], int(r["prefetch"]), r["tier"])
        if key in seen:
            continue
        seen.add(key)
        ups.append(r)
        if len(ups) == 2:
            break
    for r in ups:
        text += " " + _versus(b, r)
    rejected = int((~tried["fits"]).sum())
    if rejected:
        text += f" {rejected} plan{'s' if rejected != 1 else ''} tried did not fit and were left out."
    return text


def _versus(b: Any, r: Any) -> str:
    slower = (r["step_s"] / b["step_s"] - 1) * 100 if b["step_s"] > 0 else 0.0
    why = []
    dr = int(r["resident_layers"]) - int(b["resident_layers"])
    if dr:
        why.append(f"{abs(dr)} {'more' if dr > 0 else 'fewer'} resident")
    if int(r["prefetch"]) != int(b["prefetch"]):
        why.append(f"prefetch {int(r['prefetch'])}")
    dp = int(r["pinned_bytes"]) - int(b["pinned_bytes"])
    if dp:
        why.append(f"{format_bytes(abs(dp))} {'more' if dp > 0 else 'less'} pinned")
    if r["tier"]:
        why.append(f"tier {r['tier']}")
    if r["residency"] != b["residency"]:
        why.append(f"{r['residency']} residency")
    if r["order"] != b["order"]:
        why.append(f"order {r['order']}")
    diff = ", ".join(why) or "the same placement"
    if slower < 0.1:
        return (f"Runner-up #{int(r['id'])} ({diff}) ties it at {r['step_s']:.3f} s; the best holds "
                f"{format_bytes(int(b['device_peak_bytes']))} of device memory against "
                f"{format_bytes(int(r['device_peak_bytes']))} (ties go to the smaller device peak, then "
                f"fewer pinned bytes).")
    return f"Runner-up #{int(r['id'])} ({diff}) is {slower:.1f} % slower at {r['step_s']:.3f} s."
