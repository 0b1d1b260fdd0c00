"""Other engines' offload settings as offload-lab plans, simulated side by side, and a plan
exported as an engine's settings.

* :func:`as_plan` — what diffusers' group offloading, diffusers' model / sequential CPU
  offload, SGLang's layerwise offload or offload-lab does with given settings, as a
  :class:`~offload_lab.Plan` whose reasons speak the engine's terms;
* :func:`compare` — every engine over a small grid of its own settings, simulated on one device
  and host: step time, evidence, host bytes really pinned, device peak, fits; :func:`figure`
  draws the frame;
* :func:`to_engine` — the nearest settings of an engine that realise a plan, as code or flags,
  with what the engine cannot express and what that costs (``Plan.to_engine`` and
  ``Recommendation.to_engine`` call it).

>>> from offload_lab import engines
>>> engines.names()
['diffusers-group', 'diffusers-model', 'sglang-layerwise', 'offload-lab']
"""

from __future__ import annotations

from offload_lab.engines.compare import COLUMNS, compare, figure, grid
from offload_lab.engines.errors import EngineError
from offload_lab.engines.export import EngineSettings, to_engine
from offload_lab.engines.plans import (
    DESCRIPTIONS,
    ENGINES,
    as_plan,
    defaults,
    engine_of,
    names,
    onloads,
    pinned_bytes,
)

__all__ = ["ENGINES", "DESCRIPTIONS", "COLUMNS", "EngineError", "EngineSettings", "names", "defaults", "as_plan",
           "engine_of", "pinned_bytes", "onloads", "compare", "figure", "grid", "to_engine"]
