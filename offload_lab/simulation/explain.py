"""One paragraph on a :class:`~offload_lab.simulation.recommend.Recommendation`: what bounds the
best plan's step and why it beats the runner-ups (every time in it is simulated)."""

from __future__ import annotations

from typing import Any

from offload_lab.planning.device import activation_bytes
from offload_lab.planning.planner import pinned_footprint
from offload_lab.simulation.engine import simulate
from offload_lab.units import format_bytes

__all__ = ["explain", "step_bound", "step_text"]


def step_text(step_s: float, calls: int, guidance: int | None = None) -> str:
    """A step time with its calls spelled out, so a per-call and a per-step figure never pass
    for one another; ``guidance`` (the model's forwards per denoising step) adds what a
    guided step would take when it differs from ``calls``.

    >>> step_text(30.52, 2)
    '15.260 s per call × 2 calls = 30.520 s/step'
    >>> step_text(15.26, 1, guidance=2)
    '15.260 s/step (1 call; 2 calls with guidance: ≈ 30.520 s)'
    """
    if calls == 1:
        text = f"{step_s:.3f} s/step (1 call"
        if guidance and guidance != 1:
            text += f"; {guidance} calls with guidance: ≈ {step_s * guidance:.3f} s"
        return text + ")"
    text = f"{step_s / calls:.3f} s per call × {calls} calls = {step_s:.3f} s/step"
    if guidance and guidance != calls:
        text += f" ({guidance} calls with guidance: ≈ {step_s / calls * guidance:.3f} s)"
    return text


def step_bound(timer: Any, plan: Any) -> dict[str, float]:
    """Seconds per step of compute and of streamed copies, and their max (the bound).

    Compute and copies overlap at best, so a step can not be faster than the larger of the two.
    """
    passes = timer.passes
    compute = sum(timer.compute.values()) * passes
    df = plan.layers[plan.layers["streamed"]]
    copy = sum(timer.copy_seconds(str(t), int(b), int(m))[0] for t, b, m in zip(df["tier"], df["bytes"], df["mapped_bytes"]))
    copy *= passes
    blocking = sum(timer.copy_seconds(str(t), int(b), int(m))[0] for t, b, m in zip(df["tier"], df["bytes"], df["mapped_bytes"])
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
    """The paragraph: the best and its step per call and per step, what bounds it (compute or
    copies) and what that means, the device headroom left, why it beats the runner-ups, and —
    when the simulator marks its prediction unconfirmed — what the before-compute order predicts."""
    if rec.best is None:
        return _nothing_fits(rec, s)
    tried = rec.tried
    b = rec.best_row
    best = rec.best
    calls = s.timer.passes
    bd = step_bound(s.timer, best)
    streamed = best.layers["streamed"]
    pinned = int(b["pinned_bytes"])
    if bd["copy_s"] > bd["compute_s"]:
        what = (f"It is copy-bound: its {int(streamed.sum())} streamed layers move "
                f"{format_bytes(int(best.layers.loc[streamed, 'bytes'].sum()) * calls)} per step, "
                f"{bd['copy_s']:.3f} s on the link against {bd['compute_s']:.3f} s of compute")
        if bd["blocking_s"] > 0:
            what += f" ({bd['blocking_s']:.3f} s of it in copies that block the host)"
        what += ", so the link sets the pace: every layer made resident or pinned shortens the step."
    elif bd["copy_s"] > 0:
        what = (f"It is compute-bound: {bd['compute_s']:.3f} s of compute hides {bd['copy_s']:.3f} s of "
                f"copies per step, so ")
        what += (f"pinning buys nothing here (no plan tried is more than {rec.tolerance * 100:g} % faster)."
                 if pinned == 0 else
                 "the copies are not what costs time; its pins keep the ones that would block the host "
                 "off the host thread.")
    else:
        what = (f"It is compute-bound with nothing streamed: {bd['compute_s']:.3f} s of compute per step, so "
                f"pinning buys nothing here.")
    peak = int(b["device_peak_bytes"])
    text = (f"Best of {len(tried)} plans ({int(tried['fits'].sum())} fit host and device): "
            f"{int(b['resident_layers'])} layers resident ({b['residency']}), prefetch {int(b['prefetch'])}, "
            f"{format_bytes(pinned)} pinned, device peak {format_bytes(peak)} (estimate) of "
            f"{format_bytes(rec.device_memory)}, leaving {format_bytes(rec.device_memory - peak)} of device "
            f"memory free; simulated {step_text(float(b['step_s']), calls)}, bound {bd['bound_s']:.3f} s. "
            f"{what}")
    ok = tried[tried["fits"]]
    fastest = ok.loc[ok["step_s"].idxmin()]
    tol = f"{rec.tolerance * 100:g} %"
    if int(fastest["id"]) == int(b["id"]) or fastest["step_s"] >= b["step_s"]:
        text += f" It is the fastest plan tried; none within {tol} of it spends less."
    else:
        behind = (b["step_s"] / fastest["step_s"] - 1) * 100
        how = "It ties" if behind < 0.005 else f"It is {behind:.2f} % slower than"
        text += (f" {how} the fastest plan tried "
                 f"(#{int(fastest['id'])}, {fastest['step_s']:.3f} s, {format_bytes(int(fastest['pinned_bytes']))} "
                 f"pinned, device peak {format_bytes(int(fastest['device_peak_bytes']))}); within {tol} of the "
                 f"fastest it pins the fewest host bytes, then holds the smallest device peak, then the fewest "
                 f"resident layers.")
    if pinned:
        pow2 = pinned_footprint(best, "pow2")
        if pow2 != pinned:
            text += (f" Pinned through a caching allocator that rounds each layer's store up to a power of two, "
                     f"its pins would lock {format_bytes(pow2)}"
                     + (f", more than the host can spend ({format_bytes(rec.host.spendable)})."
                        if pow2 > rec.host.spendable else "."))
    text += _evidence(rec)
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
    limit = fastest["step_s"] * (1 + rec.tolerance) * (1 + 1e-12)
    for r in ups:
        text += " " + _versus(b, r, r["step_s"] <= limit, tol)
    rejected = int((~tried["fits"]).sum())
    if rejected:
        text += (f" {rejected} plan{'s' if rejected != 1 else ''} tried did not fit and "
                 f"{'were' if rejected != 1 else 'was'} left out.")
    return text


def _evidence(rec: Any) -> str:
    """A sentence when the simulator marks the best plan's prediction unconfirmed: the step the
    before-compute issue order predicts for the same plan (the other order the runtime has)."""
    kw = {"steps": 2, "tokens": rec.tokens, "passes": rec.calls_per_step}
    ev = simulate(rec.best, rec.profile, **kw).meta.get("evidence") or {}
    if not isinstance(ev, dict) or ev.get("status") != "unconfirmed":
        return ""
    other = simulate(rec.best, rec.profile, issue="before-compute", **kw)
    return (f" No measured run confirms this prediction (evidence: unconfirmed); with copies issued "
            f"before compute the same plan is predicted at {float(other.steps['wall_s'].iloc[-1]):.3f} s per step.")


def _versus(b: Any, r: Any, keeps: bool, tol: str) -> str:
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
    if not keeps:
        return f"Runner-up #{int(r['id'])} ({diff}) is {slower:.1f} % slower at {r['step_s']:.3f} s."
    if dp > 0:
        cost = f"pins {format_bytes(dp)} more"
    elif int(r["device_peak_bytes"]) > int(b["device_peak_bytes"]):
        cost = (f"holds {format_bytes(int(r['device_peak_bytes']))} of device memory against "
                f"{format_bytes(int(b['device_peak_bytes']))}")
    else:
        cost = "keeps more layers resident"
    return (f"Runner-up #{int(r['id'])} ({diff}) keeps the pace at {r['step_s']:.3f} s (within {tol}) but {cost}.")
