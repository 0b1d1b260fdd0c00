"""What the notebook layer makes of a live model: its spec (``%offload_profile`` and ``PlanExplorer``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from offload_lab.model.load import spec_of

if TYPE_CHECKING:
    from torch import nn

    from offload_lab.model.spec import ModelSpec

__all__ = ["spec_for_model"]


def spec_for_model(model: nn.Module) -> ModelSpec:
    """The spec of a live module; synthetic models keep their catalog name and ``meta``.

    >>> from offload_lab import catalog, synthetic
    >>> spec_for_model(synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=2)).name
    'wan2.1-t2v-1.3b'
    """
    return spec_of(model)
