"""What the ``offload-lab`` commands read: a MODEL, ``--tokens``, a device profile, a saved run
or trace, a ``--plan`` file, and the plan the plan options describe.

Each refusal is one :class:`~offload_lab.cli.common.CliError` line naming the value and what is
accepted. These readers import the model, planning, record and simulation modules (pandas),
never torch, so the light commands (``plan``, ``simulate``, ``catalog``, ``report``) stay light.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path
from typing import Any

from offload_lab.cli.common import CliError
from offload_lab.model import catalog
from offload_lab.model.flops import resolve_tokens
from offload_lab.model.spec import ModelSpec, SpecError
from offload_lab.planning.options import plan_kwargs
from offload_lab.planning.planner import Plan, PlanError, PlanWarning, plan
from offload_lab.reading import MAX_JSON_BYTES, read_text
from offload_lab.record.kineto import from_torch_profiler
from offload_lab.record.run import Run
from offload_lab.simulation import DeviceProfile, names
from offload_lab.writing import REGULAR, kind_of

__all__ = ["resolve_spec", "resolve_tokens_arg", "is_checkpoint", "device_profile", "load_run",
           "read_plan", "make_plan"]


def resolve_spec(text: str) -> tuple[ModelSpec, str]:
    """``(spec, kind)`` for a MODEL argument; kind is ``catalog``, ``safetensors`` or ``json``.

    >>> spec, kind = resolve_spec("Wan2.1-T2V-14B")
    >>> spec.name, kind
    ('wan2.1-t2v-14b', 'catalog')
    """
    known = catalog.names()
    key = text.strip().lower().removesuffix(".json")
    p = Path(text)
    looks_like_path = p.exists() and (os.sep in text or p.suffix in (".json", ".safetensors") or p.is_dir())
    if key in known and not looks_like_path:
        return catalog.load(key), "catalog"
    accepted = (f"a catalog name ({', '.join(known)}), a .safetensors file, a directory of them, "
                f"a *.safetensors.index.json, or a model spec JSON")
    if not text.strip():
        raise CliError(f"MODEL '' is empty; accepted: {accepted}")
    if not p.exists():
        raise CliError(f"MODEL {text!r} is not a catalog model nor an existing file; accepted: {accepted}")
    if p.is_dir() or p.name.endswith(".safetensors") or p.name.endswith(".index.json"):
        return ModelSpec.from_safetensors(p), "safetensors"
    if p.suffix == ".json":
        try:
            return ModelSpec.from_json(p), "json"
        except (SpecError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
            why = (f" ({e})" if isinstance(e, SpecError)
                   else " (not UTF-8 text)" if isinstance(e, UnicodeDecodeError) else "")
            raise CliError(f"MODEL {text!r} is not an offload-lab model spec JSON{why}; "
                           f"accepted: {accepted}") from None
    raise CliError(f"MODEL {text!r} is a file of an unknown kind; accepted: {accepted}")


def resolve_tokens_arg(spec: ModelSpec, tokens: int | str | None) -> int | None:
    """``--tokens`` as a count: a resolution name (``480p``) is read from the model's spec.

    >>> resolve_tokens_arg(catalog.load("wan2.1-t2v-1.3b"), "480p"), resolve_tokens_arg(None, 256)
    (32760, 256)
    """
    if tokens is None or isinstance(tokens, int):
        return tokens
    return resolve_tokens(spec, tokens)


def is_checkpoint(p: Path) -> bool:
    """Whether a MODEL path names a safetensors checkpoint (a file, a directory, an index)."""
    return p.exists() and (p.is_dir() or p.name.endswith((".safetensors", ".index.json")))


def device_profile(text: str) -> DeviceProfile:
    """``--device`` as a profile: a shipped name or a device profile JSON file."""
    p = Path(text)
    if not text.strip():  # before is_dir: Path('') is the current directory
        raise CliError(f"--device '' is empty; expected a shipped profile name ({', '.join(names())}) "
                       f"or a device profile JSON file")
    if p.is_dir():
        raise CliError(f"--device {text!r} is a directory; expected a shipped profile name "
                       f"({', '.join(names())}) or a device profile JSON file")
    if kind_of(p) not in (REGULAR, None):  # reading a FIFO would wait for a writer forever
        raise CliError(f"--device {text!r} is a {kind_of(p)}; expected a shipped profile name "
                       f"({', '.join(names())}) or a device profile JSON file")
    return DeviceProfile.load(text)


def load_run(path: Path) -> Run:
    """A saved run, or a torch.profiler / Kineto trace (read as a run of backend ``trace``)."""
    if path.name.endswith((".json", ".json.gz")):
        return from_torch_profiler(path)
    return Run.load(path)


def read_plan(path: str) -> Plan:
    """A ``--plan`` file: the output of ``offload-lab plan MODEL --json``."""
    accepted = "accepted: the output of offload-lab plan MODEL --json"
    if kind_of(path) not in (REGULAR, None):
        raise CliError(f"--plan {path!r} is a {kind_of(path)}, not a file; {accepted}")
    try:
        # a regular file of at most 64 MiB: a FIFO or /dev/zero is refused unread
        return Plan.from_json(read_text(path, "--plan file", MAX_JSON_BYTES,
                                        accepted="the output of offload-lab plan MODEL --json, "
                                                 "a regular file of at most 64 MiB"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CliError(f"--plan {path!r} is not JSON ({e}); {accepted}") from None
    except (PlanError, KeyError, TypeError) as e:
        why = str(e) if isinstance(e, PlanError) else "not an offload-lab plan"
        raise CliError(f"--plan {path!r}: {why}; {accepted}") from None


def make_plan(spec: ModelSpec, args: argparse.Namespace, host: Any = None, **overrides: Any) -> Plan:
    """plan() from the plan options; warnings are kept in ``Plan.warnings`` and printed by us."""
    if getattr(args, "host", None) is not None:
        host = args.host  # plan() reads a size as a hypothetical host, like every surface
    kwargs = {**plan_kwargs(args), "host": host, **overrides}
    with warnings.catch_warnings():
        # the CLI prints Plan.warnings itself, once and readably
        warnings.simplefilter("ignore", PlanWarning)
        return plan(spec, **kwargs)
