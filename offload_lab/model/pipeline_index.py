"""A pipeline directory's ``model_index.json``, checked by offload-lab before any diffusers call.

``from_pretrained`` turns each ``[library, class]`` entry of the index into an import and a
``getattr``; a directory is data, so offload-lab decides first what it will let diffusers load:

- the pipeline's ``_class_name`` is a class diffusers exports, a ``DiffusionPipeline``;
- each component names ``diffusers`` or ``transformers`` (or one of diffusers' own pipeline
  modules, as older indexes do: ``["stable_diffusion", "StableDiffusionSafetyChecker"]``) and a
  class that library exports, of a loadable kind (a model, scheduler, tokenizer, processor,
  feature extractor or pipeline); ``[null, null]`` is a component left out;
- no component folder holds Python code, and nothing a component folder holds resolves outside
  the directory (symlinks included);
- a component's weights are safetensors files: a folder whose weights are pickle files only
  (``.bin``, ``.pt``, ``.pth``, ``.ckpt``, ``.pkl``) is refused, since unpickling can run code;
  pickle files beside safetensors ones are never read (the pipeline is loaded with
  ``use_safetensors=True``);

Names are checked against the library's own export table (its lazy module's name → module map)
before anything is looked up, so a name the index makes up is never imported. Every refusal is
a one-line :class:`~offload_lab.model.spec.SpecError` naming the entry and what is accepted.

>>> check_pipeline_index("/nonexistent")
Traceback (most recent call last):
...
offload_lab.model.spec.SpecError: '/nonexistent' is not a diffusers pipeline directory: it has no model_index.json
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offload_lab.model.spec import SpecError
from offload_lab.reading import InputFileError, read_json

__all__ = ["LIBRARIES", "PipelineIndex", "read_model_index", "check_pipeline_index"]

#: the libraries a component may come from
LIBRARIES = ("diffusers", "transformers")
#: the largest model_index.json read; real ones are under 2 KiB
INDEX_CAP_BYTES = 1 << 20
# the loadable kinds: the bases diffusers itself loads components through
_KINDS = {
    "diffusers": ("ModelMixin", "SchedulerMixin", "DiffusionPipeline", "BaseGuidance"),
    "transformers": ("PreTrainedModel", "PreTrainedTokenizerBase", "ProcessorMixin",
                     "ImageProcessingMixin", "FeatureExtractionMixin"),
}
_KIND_WORDS = "a model, scheduler, tokenizer, processor, feature extractor or pipeline class"


@dataclass(frozen=True)
class PipelineIndex:
    """A checked ``model_index.json``: the pipeline class, the components to load and those
    left out (``[null, null]``, or listed without a folder: diffusers is passed ``None``)."""

    root: Path
    class_name: str
    components: dict[str, tuple[str, str]]
    absent: tuple[str, ...]

    def pipeline_class(self) -> Any:
        """The diffusers pipeline class, looked up by a name already checked."""
        import diffusers

        return getattr(diffusers, self.class_name)


def read_model_index(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (a ``model_index.json``): a regular file of at most
    :data:`INDEX_CAP_BYTES`, keys given once. All reading of the index goes through here."""
    where = repr(str(path))

    def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise SpecError(f"{where} names {k!r} twice")
            out[k] = v
        return out

    try:
        info = read_json(path, "pipeline index", INDEX_CAP_BYTES,
                         accepted="a model_index.json of a few lines", object_pairs_hook=once)
    except InputFileError as e:
        raise SpecError(str(e)) from None
    if not isinstance(info, dict):
        raise SpecError(f"{where} holds a {type(info).__name__}; expected a JSON object")
    return info


def _inside(root: Path, p: Path) -> bool:
    try:
        return p.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a symlink loop
        return False


def _exported(library: str, name: str) -> Any:
    """``library.name`` when ``library`` is installed and exports a class ``name``, else None.

    The lazy module's name → submodule table is read before the attribute: a name it does not
    hold (a submodule, a dunder, a made-up name) is never looked up, so nothing it names is
    imported. The lookup itself imports only the library's own module that defines the class.
    """
    if importlib.util.find_spec(library) is None:
        return None
    lib = importlib.import_module(library)
    table = getattr(lib, "_class_to_module", None)
    if isinstance(table, dict):
        known = name in table
    else:  # not a lazy module: its public names, submodules excluded below by the type check
        known = name in getattr(lib, "__all__", ())
    if not known:
        return None
    try:
        obj = getattr(lib, name)
    except Exception:  # noqa: BLE001 - an optional backend missing: not a usable class here
        return None
    return obj if isinstance(obj, type) else None


def _pipeline_module(library: str) -> Any:
    """diffusers' own pipeline module ``library`` (``stable_diffusion``), or None."""
    spec = importlib.util.find_spec("diffusers")
    # looked for on disk first: a name that is no folder of diffusers' pipelines costs no import
    places = spec.submodule_search_locations if spec is not None else None
    if not places or not any((Path(p) / "pipelines" / library / "__init__.py").is_file()
                             for p in places):
        return None
    import diffusers.pipelines as pipelines

    if library not in getattr(pipelines, "_modules", ()):
        return None
    return getattr(pipelines, library)


def _loadable(obj: type) -> bool:
    """Whether ``obj`` derives from a base diffusers loads components through. A library's
    bases are looked up only when ``obj`` derives from something of that library (transformers'
    model base is a heavy import a diffusers-only pipeline need not pay)."""
    roots = {c.__module__.split(".")[0] for c in obj.__mro__}
    for library, names in _KINDS.items():
        if library not in roots:
            continue
        lib = importlib.import_module(library)
        bases = tuple(c for c in (getattr(lib, n, None) for n in names) if isinstance(c, type))
        if issubclass(obj, bases):
            return True
    return False


def _component_class(where: str, name: str, library: str, cls: str) -> None:
    accepted = f"{' or '.join(LIBRARIES)} (or a diffusers pipeline module)"
    if library in LIBRARIES:
        if importlib.util.find_spec(library) is None:
            raise SpecError(f"{where}: component {name!r} needs {library}, which is not installed: "
                            f"pip install 'offload-lab[diffusers]'")
        obj = _exported(library, cls)
    else:
        mod = _pipeline_module(library)
        if mod is None:
            raise SpecError(f"{where}: component {name!r} names library {library!r}; accepted: "
                            f"{accepted}; custom code is not loaded")
        table = getattr(mod, "_class_to_module", None)
        obj = getattr(mod, cls, None) if isinstance(table, dict) and cls in table else None
        obj = obj if isinstance(obj, type) else None
    if obj is None:
        raise SpecError(f"{where}: component {name!r} names class {cls!r}, which {library} does "
                        f"not export; expected {_KIND_WORDS} of {library}")
    if not _loadable(obj):
        raise SpecError(f"{where}: component {name!r} names {library}.{cls}, which is not "
                        f"{_KIND_WORDS}")


#: weight files in Python's pickle format (torch.save and the like): loading one can run code
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def _check_folder(where: str, root: Path, name: str, folder: Path) -> None:
    if not _inside(root, folder):
        raise SpecError(f"{where}: component folder {name!r} resolves outside the directory; refused")
    files = sorted(folder.rglob("*"))
    pickles = [p for p in files if p.suffix in PICKLE_SUFFIXES]
    if pickles and not any(p.suffix == ".safetensors" for p in files):
        raise SpecError(f"{where}: component {name!r} holds its weights as pickle files only "
                        f"({str(pickles[0].relative_to(folder.parent))!r}), which can run code when "
                        f"loaded; save it with safe_serialization=True (safetensors)")
    for p in files:
        if not _inside(root, p):
            raise SpecError(f"{where}: {str(p.relative_to(folder.parent))!r} resolves outside the "
                            f"directory; refused")
        if p.suffix in (".py", ".pyc", ".so"):
            raise SpecError(f"{where}: component {name!r} holds code "
                            f"({str(p.relative_to(folder.parent))!r}); custom code is not loaded")


def check_pipeline_index(path: str | os.PathLike) -> PipelineIndex:
    """The checked index of the pipeline directory ``path``; a one-line SpecError otherwise.

    Nothing the index names is imported before its name is found in the export table of a
    library offload-lab supports.
    """
    given = Path(path)
    index = given / "model_index.json"
    if not index.is_file():
        raise SpecError(f"{str(given)!r} is not a diffusers pipeline directory: it has no model_index.json")
    where = repr(str(index))
    try:
        root = given.resolve()
    except (OSError, RuntimeError) as e:
        raise SpecError(f"cannot resolve {str(given)!r}: {e}") from None
    if not _inside(root, index):
        raise SpecError(f"{where} links outside its directory; refused")
    info = read_model_index(index)
    cname = info.get("_class_name")
    if not isinstance(cname, str):
        raise SpecError(f"{where}: _class_name is {_short(cname)}; expected the name of a diffusers "
                        f"pipeline class (a custom pipeline's code is not loaded)")
    entries: dict[str, tuple[Any, Any]] = {}
    for name, entry in info.items():
        if name.startswith("_") or not isinstance(entry, list):
            continue  # the pipeline's own settings (boundary_ratio, expand_timesteps...)
        if (len(entry) != 2 or not all(e is None or isinstance(e, str) for e in entry)
                or (entry[0] is None) != (entry[1] is None)):
            raise SpecError(f"{where}: component {name!r} is {_short(entry)}; expected "
                            f"[library, class] (two strings) or [null, null]")
        if not name.isidentifier():
            raise SpecError(f"{where}: component name {name!r} is not a Python identifier")
        entries[name] = (entry[0], entry[1])
    for name, (library, cls) in entries.items():
        if library is not None and not (library.isidentifier() and cls.isidentifier()
                                        and not cls.startswith("_")):
            raise SpecError(f"{where}: component {name!r} is [{library!r}, {cls!r}]; expected a "
                            f"library and a public class name (identifiers)")
    for name, (library, _) in entries.items():
        folder = root / name
        if library is not None and (folder.exists() or folder.is_symlink()):
            _check_folder(where, root, name, given / name)
    if not cname.isidentifier() or cname.startswith("_"):
        raise SpecError(f"{where}: _class_name {cname!r} is not a class name; expected a diffusers "
                        f"pipeline class")
    if importlib.util.find_spec("diffusers") is None:
        raise SpecError(f"{where} names diffusers pipeline {cname!r}; reading it needs diffusers: "
                        f"pip install 'offload-lab[diffusers]'")
    pipe_cls = _exported("diffusers", cname)
    from diffusers import DiffusionPipeline

    if pipe_cls is None or not issubclass(pipe_cls, DiffusionPipeline):
        raise SpecError(f"{where}: _class_name {cname!r} is not a pipeline class diffusers exports "
                        f"(a DiffusionPipeline such as 'WanPipeline')")
    for name, (library, cls) in entries.items():
        if library is not None:
            _component_class(where, name, library, cls)
    absent = tuple(n for n, (library, _) in entries.items()
                   if library is None or not (given / n).is_dir())
    comps = {n: e for n, e in entries.items() if n not in absent}
    return PipelineIndex(given, cname, comps, absent)  # type: ignore[arg-type]


def _short(x: object) -> str:
    s = repr(x)
    return s if len(s) <= 60 else s[:57] + "..."
