"""A plan as another engine's settings: :func:`to_engine`.

The answer is the nearest settings of the engine that realise the plan — the code a user pastes
(``pipe.transformer.enable_group_offload(...)``) or the command-line flags
(``--dit-layerwise-offload ...``) — with what the engine cannot express (per-layer pin grants,
mixed tiers, resident layers, a prefetch depth, the issue order) and, given a device, what that
costs in the simulation: the plan's step and pinned bytes beside those of the engine's nearest
plan (:func:`~offload_lab.engines.as_plan` of those settings).

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
>>> p = offload_lab.plan(spec, pin_budget="8GiB", host=offload_lab.HostMemory(available="64GiB"))
>>> out = to_engine(p, "sglang-layerwise")
>>> out.code
'--dit-layerwise-offload --dit-offload-prefetch-size 1 --pin-cpu-memory'
>>> [c.split(":")[0] for c in out.cannot_express]
['issue order after-compute', 'per-layer pin grants beyond the host budget']
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from offload_lab.engines.compare import extra_seconds, settings_text, step_seconds
from offload_lab.engines.errors import EngineError
from offload_lab.engines.plans import ENGINES, as_plan, pinned_bytes
from offload_lab.planning.errors import PlanWarning
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.planner import Plan
from offload_lab.simulation.profile import DeviceProfile
from offload_lab.units import format_bytes

__all__ = ["EngineSettings", "to_engine"]


@dataclass(eq=False)
class EngineSettings:
    """What :func:`to_engine` answers."""

    engine: str
    """The engine's name (:func:`~offload_lab.engines.names`)."""
    settings: dict[str, Any]
    """The engine's settings, by its own option names."""
    code: str
    """What to paste: Python for diffusers and offload-lab, the command-line flags for SGLang."""
    flags: list[str]
    """Command-line arguments (SGLang), one per item; empty for the Python engines."""
    cannot_express: list[str]
    """What of the plan the engine cannot express, each with what it changes."""
    nearest: Plan
    """The engine's own plan for ``settings`` (:func:`~offload_lab.engines.as_plan`)."""
    costs: dict[str, Any] = field(default_factory=dict)
    """The plan and ``nearest`` side by side: pinned bytes, device peak and, given a device, the
    simulated step (``step_s``, ``engine_step_s``, ``extra_s``, ``device``)."""

    def __str__(self) -> str:
        lines = [f"{self.engine}: {settings_text(self.engine, self.settings)}", self.code]
        if self.cannot_express:
            lines.append("cannot express:")
            lines += [f"  - {c}" for c in self.cannot_express]
        c = self.costs
        if "step_s" in c:
            lines.append(f"simulated on {c['device']}: plan {c['step_s']:.3f} s/step, {self.engine} "
                         f"{c['engine_step_s']:.3f} s/step ({c['engine_step_s'] / c['step_s'] - 1:+.1%})")
        lines.append(f"pinned: plan {format_bytes(c['pinned_bytes'])}, {self.engine} "
                     f"{format_bytes(c['engine_pinned_bytes'])}; device peak: plan "
                     f"{format_bytes(c['device_peak_bytes'])}, {self.engine} {format_bytes(c['engine_device_peak_bytes'])}")
        return "\n".join(lines)


def _facts(p: Plan) -> dict[str, Any]:
    df = p.layers
    streamed = df[df["streamed"]]
    tiers = streamed["tier"].value_counts().to_dict()
    return {"streamed": len(streamed), "resident": int((~df["streamed"]).sum()), "tiers": tiers,
            "pinned": int(tiers.get("pinned", 0)), "staged": int(tiers.get("staged", 0)),
            "pageable": int(tiers.get("pageable", 0)), "mapped": int(tiers.get("mapped", 0)),
            "prefetch": int(p.prefetch), "issue": (p.params or {}).get("issue", "after-compute"),
            "order": (p.params or {}).get("order", "execution"), "pin_budget": (p.params or {}).get("pin_budget")}


def _common(f: dict[str, Any], engine: str, issue: str) -> list[str]:
    out = []
    if f["resident"]:
        out.append(f"{f['resident']} resident layers: {engine} streams every block; they are streamed there "
                   f"(more copies, a smaller device peak)")
    if f["issue"] != issue:
        out.append(f"issue order {f['issue']}: {engine} issues its copies {issue} (the simulation uses {issue})")
    return out


def _diffusers_group(f: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    miss = _common(f, "diffusers", "before-compute")
    n = f["streamed"]
    if f["staged"] and f["staged"] >= f["pinned"]:
        s = {"use_stream": True, "record_stream": True, "low_cpu_mem_usage": True, "non_blocking": True}
    elif f["pinned"] and 2 * f["pinned"] >= n:
        s = {"use_stream": True, "record_stream": True, "non_blocking": True}
    else:
        s = {"use_stream": False}
    pinning = s["use_stream"] and not s.get("low_cpu_mem_usage")
    expected = "pinned" if pinning else ("staged" if s["use_stream"] else "pageable")
    others = {t: k for t, k in f["tiers"].items() if k and t != expected}
    if others:
        what = ", ".join(f"{k} {t}" for t, k in others.items())
        grants = (" — per-layer pin grants cannot be expressed: diffusers pins every group or none"
                  if f["pinned"] else "")
        miss.append(f"mixed tiers ({what} of {n} streamed layers): diffusers makes every group {expected}{grants}")
    if f["mapped"]:
        miss.append("mapped (zero-copy checkpoint views): diffusers has none; offload_to_disk_path writes and reads "
                    "its own files instead")
    if s["use_stream"] and f["prefetch"] != 1:
        miss.append(f"prefetch {f['prefetch']}: with use_stream=True diffusers onloads exactly one group ahead")
    if not s["use_stream"] and f["prefetch"] > 0:
        miss.append(f"prefetch {f['prefetch']}: without streams diffusers onloads each group when it runs")
    return s, miss


def _diffusers_code(s: dict[str, Any]) -> str:
    args = ['onload_device=torch.device("cuda")', 'offload_device=torch.device("cpu")',
            'offload_type="block_level"', "num_blocks_per_group=1"]
    args += [f"{k}={v!r}" for k, v in s.items() if k not in ("offload_type", "num_blocks_per_group")]
    return "import torch\npipe.transformer.enable_group_offload(\n    " + ",\n    ".join(args) + ",\n)"


def _diffusers_model(f: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    if f["streamed"] == 0:
        return {"mode": "model"}, []
    miss = ["per-layer offload: enable_sequential_cpu_offload moves every leaf module synchronously from pageable "
            "memory"]
    if f["pinned"] or f["staged"]:
        miss.append(f"{f['pinned'] + f['staged']} pinned/staged layers: accelerate's hooks copy from pageable memory")
    if f["resident"]:
        miss.append(f"{f['resident']} resident layers: sequential offload keeps none on the device")
    if f["prefetch"]:
        miss.append(f"prefetch {f['prefetch']}: accelerate's hooks prefetch nothing")
    return {"mode": "sequential"}, miss


def _sglang(f: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    miss = _common(f, "SGLang's layerwise offload", "before-compute")
    s = {"dit_layerwise_offload": True, "dit_offload_prefetch_size": f["prefetch"],
         "pin_cpu_memory": bool(f["pinned"] or f["staged"])}
    if f["staged"]:
        miss.append(f"{f['staged']} staged layers: SGLang has no staging buffers; with pin_cpu_memory they get "
                    f"per-layer pins from the host budget, or stay pageable")
    if f["mapped"]:
        miss.append(f"{f['mapped']} mapped layers: SGLang copies every layer into its consolidated CPU buffer")
    if f["pin_budget"] is not None and 0 < f["pinned"] < f["streamed"]:
        miss.append(f"per-layer pin grants beyond the host budget: this plan pins {f['pinned']} of {f['streamed']} "
                    f"streamed layers under a {format_bytes(f['pin_budget'])} cap; SGLang's budget comes from host "
                    f"memory (no flag caps it, assumed), so it pins as many as the host allows")
    order = f["order"]
    if order != "execution" and 0 < f["pinned"] < f["streamed"]:
        miss.append(f"pin order {order!r}: SGLang grants pins in execution order")
    return s, miss


def _flags(s: dict[str, Any]) -> list[str]:
    if not s["dit_layerwise_offload"]:
        return []
    out = ["--dit-layerwise-offload", "--dit-offload-prefetch-size", str(s["dit_offload_prefetch_size"])]
    if s["pin_cpu_memory"]:
        out.append("--pin-cpu-memory")
    return out


def _offload_lab(p: Plan) -> tuple[dict[str, Any], list[str]]:
    keep = ("pin_budget", "resident", "residency", "order", "prefetch", "tier", "staging")
    s = {k: v for k, v in (p.params or {}).items() if k in keep}
    s["issue"] = (p.params or {}).get("issue", "after-compute")
    return s, []


def _profile(device: Any) -> DeviceProfile | None:
    if device is None or isinstance(device, DeviceProfile):
        return device
    if isinstance(device, str) and device in DeviceProfile.names():
        return DeviceProfile.load(device)
    raise EngineError(f"device {device!r:.80} is not a DeviceProfile nor one of {', '.join(DeviceProfile.names())}")


def to_engine(p: Plan, engine: str, device: DeviceProfile | str | None = None, tokens: int | str | None = None,
              calls: int = 1) -> EngineSettings:
    """The nearest settings of ``engine`` that realise plan ``p`` (see the module).

    ``device`` (a profile or a shipped name) adds the simulated step of the plan and of the
    engine's nearest plan to ``costs``; ``tokens`` and ``calls`` (forwards per step) size it.

    >>> import offload_lab
    >>> p = offload_lab.plan(offload_lab.catalog.load("wan2.1-t2v-1.3b"), tier="pinned",
    ...                      host=offload_lab.HostMemory(available="64GiB"))
    >>> print(to_engine(p, "diffusers-group").code)
    import torch
    pipe.transformer.enable_group_offload(
        onload_device=torch.device("cuda"),
        offload_device=torch.device("cpu"),
        offload_type="block_level",
        num_blocks_per_group=1,
        use_stream=True,
        record_stream=True,
        non_blocking=True,
    )
    >>> to_engine(p, "vllm")
    Traceback (most recent call last):
    ...
    offload_lab.engines.errors.EngineError: engine 'vllm' is not one of diffusers-group, diffusers-model, sglang-layerwise, offload-lab
    """
    if engine not in ENGINES:
        raise EngineError(f"engine {engine!r} is not one of {', '.join(ENGINES)}")
    if not isinstance(p, Plan):
        raise EngineError(f"plan {p!r:.80} is not an offload_lab.Plan; accepted: offload_lab.plan(...), "
                          f"engines.as_plan(...) or a Recommendation's best")
    profile = _profile(device)
    f = _facts(p)
    flags: list[str] = []
    if engine == "diffusers-group":
        if f["streamed"] == 0:
            s, miss = {"use_stream": True}, ["every layer resident: no offload is nearer; "
                                             "diffusers-group would stream every block"]
        else:
            s, miss = _diffusers_group(f)
        code = _diffusers_code(s)
    elif engine == "diffusers-model":
        s, miss = _diffusers_model(f)
        code = "pipe.enable_model_cpu_offload()" if s["mode"] == "model" else "pipe.enable_sequential_cpu_offload()"
    elif engine == "sglang-layerwise":
        s, miss = _sglang(f)
        flags = _flags(s)
        code = " ".join(flags)
    else:
        s, miss = _offload_lab(p)
        args = ", ".join(f"{k}={v!r}" for k, v in s.items() if k != "issue")
        code = (f"plan = offload_lab.plan(spec, {args}, host=offload_lab.HostMemory.probe())\n"
                f"with offload_lab.offload(model, plan, issue={s['issue']!r}):\n    ...")
    params = p.params or {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        # a plan read back without its host still has the host's size in its ledger
        host = p.host if p.host is not None else HostMemory(available=int(p.ledger["available"]))
        nearest = as_plan(p.spec, engine, host=host,
                          device_memory=params.get("device_memory"), tokens=params.get("tokens"), **s)
    costs: dict[str, Any] = {
        "pinned_bytes": pinned_bytes(p), "engine_pinned_bytes": pinned_bytes(nearest),
        "device_peak_bytes": int(p.device_peak), "engine_device_peak_bytes": int(nearest.device_peak),
        "engine_fits": bool(nearest.fits),
    }
    if profile is not None:
        step, _ = step_seconds(p, profile, tokens, calls)
        step_e, _ = step_seconds(nearest, profile, tokens, calls)
        extra = extra_seconds(nearest, profile, calls)
        costs.update(device=profile.name, step_s=step + extra_seconds(p, profile, calls),
                     engine_step_s=step_e + extra, extra_s=extra)
    return EngineSettings(engine, s, code, flags, miss, nearest, costs)
