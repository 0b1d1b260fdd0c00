"""The shipped model catalog: specs of Wan2.1 T2V-1.3B, T2V-14B, I2V-14B and MiniMax-H3.

Each entry is a JSON :class:`~offload_lab.model.spec.ModelSpec` written by ``scripts/make_catalog.py``
from the published model configurations: every tensor's name, shape and dtype, the layer groups in
declared order, and ``meta`` (``arch``, ``display_name``, ``default_steps``,
``guidance_passes``, ``tokens``, ``text_tokens``, ``dims``, ``scale``, ``source``).

Which tensors are checkpoint views (``mapped``): for MiniMax-H3 every tensor but each block's
fused ``attn.qkv_proj.weight``, which is re-ordered at load time (50.53 of 61.73 GiB are views);
for Wan2.1 every tensor, since the original loader takes each checkpoint tensor by name with no
re-layout. All Wan tensors are bfloat16, matching the published byte counts.

>>> from offload_lab import catalog
>>> catalog.names()
['minimax-h3', 'wan2.1-i2v-14b', 'wan2.1-t2v-1.3b', 'wan2.1-t2v-14b']
>>> spec = catalog.load("MiniMax-H3")
>>> [(g.name, g.num_layers) for g in spec.groups]
[('token_refiner.blocks', 2), ('blocks', 50)]
>>> spec.total_bytes
66280430080

The JSON files are found in the installed package (``offload_lab/_data/models``, where the
wheel build puts them) or, in an editable install or a source tree, in the repository's
``data/models/``.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

from offload_lab.model.spec import ModelSpec, SpecError
from offload_lab.shipped import json_names, require_dir

__all__ = ["CatalogError", "names", "load", "path"]


class CatalogError(SpecError):
    """A catalog name that is not shipped (a ``ValueError``)."""


def _models_dir() -> Path:
    return require_dir("models", "model catalog", CatalogError)


def names() -> list[str]:
    """Names of the shipped models, sorted.

    >>> "wan2.1-t2v-14b" in names()
    True
    """
    return json_names("models", "model catalog", CatalogError)


def _canonical(name: str) -> str:
    if not isinstance(name, str):
        raise CatalogError(f"catalog name must be a string, got {name!r}; names: {names()}")
    key = name.strip().lower().removesuffix(".json")
    known = names()
    if key not in known:
        raise CatalogError(f"unknown catalog model {name!r}; names: {known}")
    return key


def path(name: str) -> Path:
    """The JSON file of a catalog model (name matched case-insensitively).

    >>> path("wan2.1-t2v-1.3b").name
    'wan2.1-t2v-1.3b.json'
    """
    return _models_dir() / f"{_canonical(name)}.json"


@functools.cache
def _load_cached(key: str) -> ModelSpec:
    return ModelSpec.from_json(_models_dir() / f"{key}.json")


def load(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of a catalog model; ``name`` is matched case-insensitively.

    Parsed once per process; each call returns a fresh deep copy, so a caller may change the
    spec it gets (e.g. its ``meta``) without affecting later loads.

    >>> spec = load("wan2.1-t2v-14b")
    >>> spec.group("blocks").layers[0].bytes
    702788608
    >>> load("wan2.2")
    Traceback (most recent call last):
    ...
    offload_lab.model.catalog.CatalogError: unknown catalog model 'wan2.2'; names: ['minimax-h3', 'wan2.1-i2v-14b', 'wan2.1-t2v-1.3b', 'wan2.1-t2v-14b']
    """
    return copy.deepcopy(_load_cached(_canonical(name)))
