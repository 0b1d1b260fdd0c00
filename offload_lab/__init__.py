"""offload-lab: see, predict and tune layer-wise weight offload in diffusion-model inference.

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
>>> plan = offload_lab.plan(spec, pin_budget="8GiB", host=offload_lab.HostMemory(available="64GiB"))
>>> int((plan.layers["tier"] == "pinned").sum())
12

Everything is imported lazily: ``import offload_lab`` pulls in neither plotly nor ipywidgets,
so the package and its GPU check run on machines that have only torch and pandas.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "ModelSpec": "spec", "GroupSpec": "spec", "LayerSpec": "spec", "TensorSpec": "spec",
    "spec_of": "spec", "SpecError": "spec",
    "parse_size": "units", "format_bytes": "units",
    "HostMemory": "hostmem", "is_file_backed": "hostmem",
    "Plan": "plan", "plan": "plan", "plan_pipeline": "plan", "Component": "plan",
    "PlanError": "plan",
    "Run": "timeline",
    "OffloadManager": "runtime", "offload": "runtime", "profile": "runtime",
    "compare": "analysis", "bound": "analysis", "metrics": "analysis",
    "DeviceProfile": "sim", "simulate": "sim", "calibrate": "sim",
    "report": "report", "Report": "report",
    "PlanExplorer": "widgets",
    "observe": "observe", "from_torch_profiler": "traceimport",
}
_SUBMODULES = {"catalog", "synthetic", "analysis", "viz", "spec", "plan", "hostmem", "timeline",
               "runtime", "sim", "report", "widgets", "magic", "units", "flops", "traceimport",
               "observe", "cli"}

__all__ = sorted(_EXPORTS) + sorted(_SUBMODULES)


# Where a function shares its module's name (``plan``, ``report``), importing the submodule
# would rebind the package attribute to the module; binding the function once, eagerly, keeps
# ``offload_lab.plan(...)`` a call. Both modules are light (no plotly at import).
from .plan import plan as plan  # noqa: E402
from .report import report as report  # noqa: E402


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        mod = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        value = getattr(mod, name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'offload_lab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


def load_ipython_extension(ipython) -> None:
    """``%load_ext offload_lab`` registers ``%offload_profile``."""
    from .magic import load_ipython_extension as _load

    _load(ipython)
