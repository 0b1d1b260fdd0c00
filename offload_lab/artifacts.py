"""Read back anything offload-lab saves, by what the file holds rather than by who wrote it.

:func:`load` takes a saved run (``.zip``), a plan or pipeline plan, a model spec or a device
profile (JSON with their ``format``), a torch.profiler / Kineto trace (``.json``, ``.json.gz``
or a directory of per-rank traces) or a safetensors checkpoint (a file, a directory, an index),
and returns the object it holds. Nothing is unpickled: every format is parquet or JSON.

>>> import tempfile, pathlib, offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = spec.to_json(d / "spec.json")
>>> type(load(d / "spec.json")).__name__
'ModelSpec'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# the facade over every format: it sits above all the packages whose objects it reads back
from offload_lab.errors import OffloadLabError
from offload_lab.model.spec import ModelSpec
from offload_lab.planning.pipeline import PipelinePlan
from offload_lab.planning.planner import Plan
from offload_lab.reading import MAX_JSON_BYTES, InputFileError, check_input, parse_json, read_bytes
from offload_lab.record.kineto import from_torch_profiler
from offload_lab.record.run import Run
from offload_lab.simulation.profile import DeviceProfile

__all__ = ["ArtifactError", "load", "FORMATS"]

#: the ``format`` field of each JSON artefact -> what it loads as
FORMATS = {
    "offload-lab/plan": "Plan",
    "offload-lab/pipeline-plan": "PipelinePlan",
    "offload-lab/model-spec": "ModelSpec",
    "offload-lab/device-profile": "DeviceProfile",
}
#: the most JSON read to find out what a file is; a bigger one is a trace, streamed, never read whole
_MAX_JSON_BYTES = MAX_JSON_BYTES


class ArtifactError(OffloadLabError, ValueError):
    """A path that is no offload-lab artefact (or cannot be read); the message says what it is."""


def _accepted() -> str:
    return ("a saved run (.zip), a plan, pipeline plan, model spec or device profile JSON, a "
            "torch.profiler trace (.json, .json.gz, or a directory of them), or a safetensors "
            "checkpoint (file, directory or *.safetensors.index.json)")


def _json_head(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` when it is a small offload-lab document, else None (a trace)."""
    if path.stat().st_size > _MAX_JSON_BYTES:
        return None
    try:
        doc = parse_json(read_bytes(path, "file", _MAX_JSON_BYTES), repr(str(path)))
    except InputFileError as e:
        raise ArtifactError(f"{str(e)[:300]}; accepted: {_accepted()}") from None
    return doc if isinstance(doc, dict) and doc.get("format") in FORMATS else None


def _from_json(doc: dict[str, Any]) -> Any:
    kind = FORMATS[doc["format"]]
    if kind == "Plan":
        return Plan.from_dict(doc)
    if kind == "PipelinePlan":
        return PipelinePlan.from_dict(doc)
    if kind == "ModelSpec":
        return ModelSpec.from_dict(doc)
    return DeviceProfile.from_dict(doc)


def load(path: str | os.PathLike) -> Any:
    """The object a saved offload-lab file holds: a :class:`~offload_lab.Run`, a
    :class:`~offload_lab.Plan`, a pipeline plan, a :class:`~offload_lab.ModelSpec` or a
    :class:`~offload_lab.DeviceProfile`; a torch.profiler trace is read as a Run (backend
    ``trace``) and a safetensors checkpoint as its spec.

    >>> import tempfile, pathlib, offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "sim.zip"
    >>> _ = offload_lab.simulate(plan, "h200", steps=1).save(p)
    >>> run = offload_lab.load(p)
    >>> type(run).__name__, run.simulated
    ('Run', True)
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ArtifactError(f"path {path!r} is not a path; accepted: {_accepted()}")
    p = Path(path)
    if not p.exists():
        raise ArtifactError(f"no such file or directory: {str(p)!r}")
    name = p.name.lower()
    if not p.is_dir():
        try:  # a FIFO or a device is refused here, unopened, whatever its name
            check_input(p, "file", None, accepted=_accepted())
        except InputFileError as e:
            raise ArtifactError(str(e)) from None
    if p.is_dir():
        if any(p.glob("*.safetensors")) or any(p.glob("*.safetensors.index.json")):
            return ModelSpec.from_safetensors(p)
        return from_torch_profiler(p)
    if name.endswith(".zip"):
        return Run.load(p)
    if name.endswith(".safetensors") or name.endswith(".safetensors.index.json"):
        return ModelSpec.from_safetensors(p)
    if name.endswith(".json"):
        doc = _json_head(p)
        if doc is not None:
            return _from_json(doc)
    if name.endswith((".json", ".json.gz")):
        return from_torch_profiler(p)
    raise ArtifactError(f"{str(p)!r} is not an offload-lab artefact by its name; accepted: {_accepted()}")
