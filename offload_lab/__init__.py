"""offload-lab: see, predict and tune layer-wise weight offload in diffusion-model inference.

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
>>> plan = offload_lab.plan(spec, pin_budget="8GiB", host=offload_lab.HostMemory(available="64GiB"))
>>> int((plan.layers["tier"] == "pinned").sum())
12

The package follows the flow of data: ``model`` (specs, checkpoints, catalog) → ``planning``
(host memory, the planner) → ``record`` (the ``Run``, the runtime, the observer, trace import)
→ ``simulation`` (device profiles, the engine, calibration) → ``analysis`` → ``views``
(figures, the report) → ``notebook`` and ``cli``. The public API lives here, at the root.

Everything is imported lazily: ``import offload_lab`` pulls in neither torch, plotly nor
ipywidgets, so the package and its GPU check run on machines that have only torch and pandas.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

# public name -> module that defines it
_EXPORTS = {
    "ModelSpec": "model.spec", "GroupSpec": "model.spec", "LayerSpec": "model.spec",
    "TensorSpec": "model.spec", "spec_of": "model.load", "SpecError": "model.spec",
    "PipelineSpec": "model.pipeline", "PipelinePlan": "planning.pipeline",
    "parse_size": "units", "format_bytes": "units",
    "HostMemory": "planning.hostmem", "is_file_backed": "filemaps",
    "Plan": "planning.planner", "plan": "planning.planner", "plan_pipeline": "planning.pipeline",
    "staging_buffers": "planning.grants",
    "Component": "planning.pipeline", "PlanError": "planning.errors",
    "Run": "record.run",
    "OffloadManager": "record.runtime", "offload": "record.runtime", "profile": "record.runtime",
    "observe": "record.observer", "from_torch_profiler": "record.kineto",
    "TraceImportOptions": "record.kineto",
    "to_chrome_trace": "record.chrome_trace", "gather": "record.gather",
    "compare": "analysis.comparison", "bound": "analysis.summary", "metrics": "analysis.summary",
    "DeviceProfile": "simulation.profile", "simulate": "simulation.engine",
    "calibrate": "simulation.calibration", "NodeProfile": "simulation.node", "plan_of_run": "simulation.runs",
    "recommend": "simulation.recommend", "Recommendation": "simulation.recommend",
    "held_out": "simulation.heldout",
    "report": "views.report", "Report": "views.report",
    "PlanExplorer": "notebook.explorer",
    "shipped_runs": "record.shipped", "load": "artifacts", "OffloadLabError": "errors",
}
# submodules users reach from the root: ``offload_lab.catalog.load(...)``
_MODULES = {
    "catalog": "model.catalog", "synthetic": "model.synthetic", "flops": "model.flops",
    "figures": "views.figures", "engines": "engines",
}
_PACKAGES = {"model", "planning", "record", "simulation", "analysis", "views", "notebook", "cli"}

__all__ = sorted(_EXPORTS) + sorted(_MODULES)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name in _MODULES:
        value = importlib.import_module(f".{_MODULES[name]}", __name__)
    elif name in _PACKAGES:
        return importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'offload_lab' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext offload_lab`` registers ``%offload_profile``."""
    # a lazy hook like the exports above: IPython calls it, and the package root imports nothing
    importlib.import_module(".notebook.magic", __name__).load_ipython_extension(ipython)
