"""The ``offload-lab`` subcommands ``plan``, ``profile``, ``simulate``, ``report`` and ``catalog``
(``demo`` is :mod:`offload_lab.cli.demo`), and the steps they share.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from offload_lab.cli.app import SIM_HOST, CliError, _comparison_text, _one_line, text_table
from offload_lab.cli.outputs import check_output, cleaned_up
from offload_lab.cli.progress import Progress
from offload_lab.cli.sizing import Sizing, choose_size
from offload_lab.planning.options import plan_kwargs
from offload_lab.record.run import display_label
from offload_lab.units import format_bytes
from offload_lab.writing import REGULAR, kind_of

if TYPE_CHECKING:
    from torch import nn

    from offload_lab.model.spec import ModelSpec
    from offload_lab.planning.planner import Plan
    from offload_lab.record.run import Run

__all__ = ["resolve_spec", "cmd_plan", "cmd_profile", "cmd_simulate", "cmd_report", "cmd_catalog"]

_CPU_NOTE = (
    "note: the cpu backend has no DMA engine and no page-locking: 'pinned' there only "
    "means the copy runs on a copy thread, overlapping compute when a core is free, while 'pageable' "
    "and 'mapped' copy on the calling thread; every copy is a memcpy through the same memory "
    "bandwidth. With compute on every core pinned and pageable take about the same time by nature, "
    "and a gap measured on a CPU{here} is thread overlap, not page-locking. The pinned-vs-pageable "
    "story is told by GPU runs and by the simulator{where}, each labelled for what it is."
)


def resolve_spec(text: str) -> tuple[ModelSpec, str]:
    """``(spec, kind)`` for a MODEL argument; kind is ``catalog``, ``safetensors`` or ``json``.

    >>> spec, kind = resolve_spec("Wan2.1-T2V-14B")
    >>> spec.name, kind
    ('wan2.1-t2v-14b', 'catalog')
    """
    from offload_lab.model import catalog
    from offload_lab.model.spec import ModelSpec, SpecError

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


def _make_plan(spec: ModelSpec, args: argparse.Namespace, host: Any = None, **overrides: Any) -> Plan:
    """plan() from the plan options; warnings are kept in ``Plan.warnings`` and printed by us."""
    from offload_lab.planning.planner import PlanWarning, plan

    if getattr(args, "host", None) is not None:
        host = args.host  # plan() reads a size as a hypothetical host, like every surface
    kwargs = {**plan_kwargs(args), "host": host, **overrides}
    with warnings.catch_warnings():
        # the CLI prints Plan.warnings itself, once and readably
        warnings.simplefilter("ignore", PlanWarning)
        return plan(spec, **kwargs)


def _host_line(p: Plan) -> str:
    h = p.host
    if h is None:
        return "host: unknown"
    what = "this machine (probed)" if h.source == "probe" else h.source
    return (f"host: {what}: {format_bytes(h.available)} available, reserve {format_bytes(h.reserve)}, "
            f"spendable {format_bytes(h.spendable)}")


def _resolve_backend(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise CliError("--backend 'cuda' was asked for but torch sees no CUDA device; accepted here: cpu or auto")
    return name


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _set_threads(backend: str, threads: int | None) -> str | None:
    """Fix torch's intra-op threads for the cpu backend; returns why, for the sizing notes."""
    if backend != "cpu":
        return None
    import torch

    n = threads or _cores()
    torch.set_num_threads(n)
    passive = os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
    return (f"{n} torch thread(s) on {_cores()} core(s)"
            + (", OpenMP workers wait passively so a core taken by the copy thread or another "
               "process slows a step instead of stalling it" if passive else ""))


def _say(text: str = "") -> None:
    print(text, flush=True)


# -- subcommands --------------------------------------------------------------------------------
def cmd_plan(args: argparse.Namespace) -> int:
    """``offload-lab plan MODEL``: the plan table, ledger and warnings (or JSON).

    >>> from offload_lab.cli.app import build_parser
    >>> cmd_plan(build_parser().parse_args(["plan", "wan2.1-t2v-14b", "-b", "8GiB", "--host", "64GiB"]))
    ... # doctest: +ELLIPSIS
    wan2.1-t2v-14b (catalog): blocks ×40; ...
    40 layers: 12 pinned, 28 pageable; ...
    0
    """
    spec, kind = resolve_spec(args.model)
    p = _make_plan(spec, args)
    if args.json:
        d = p.to_dict()
        d["startup_peak"] = {s: p.startup_peak(s) for s in ("grouped", "naive")}
        print(json.dumps(d, indent=1, default=str))
        return 0
    groups = ", ".join(f"{g.name} ×{g.num_layers}" for g in spec.groups)
    _say(f"{spec.name} ({kind}): {groups}; {format_bytes(spec.layer_bytes)} of layer weights + "
         f"{format_bytes(spec.non_layer_bytes)} non-layer (always on the device)")
    _say(_host_line(p))
    _say()
    _say(text_table(p.table(), right=("layer", "size", "mapped", "pin rank")))
    _say()
    _say("ledger:")
    led = p.ledger
    for key in ("available", "reserve", "spendable", "budget", "pinned_bytes", "net_anonymous_bytes"):
        if key in led:
            _say(f"  {key:<20} {format_bytes(led[key])}")
    if "headroom" in led:
        # the ledger's headroom is what the plan could spend; the reader wants what it leaves
        after = led["headroom"] - led.get("net_anonymous_bytes", 0)
        _say(f"  {'headroom after plan':<20} {'-' if after < 0 else ''}{format_bytes(abs(after))} "
             f"(of {format_bytes(led['headroom'])} before its net new anonymous bytes)")
    _say(f"  {'fits':<20} {'yes' if led.get('fits') else 'NO'}")
    _say(f"init order: {', '.join(p.init_order)}; prefetch {p.prefetch}; startup peak on the device: "
         f"{format_bytes(p.startup_peak('grouped'))} grouped, {format_bytes(p.startup_peak('naive'))} naive")
    for w in p.warnings:
        _say(f"warning: {_one_line(w)}")
    _say(p.summary())
    return 0


def _tokens(spec: ModelSpec, tokens: int | str | None) -> int | None:
    """``--tokens`` as a count: a resolution name (``480p``) is read from the model's spec."""
    if tokens is None or isinstance(tokens, int):
        return tokens
    from offload_lab.model.flops import resolve_tokens

    return resolve_tokens(spec, tokens)


def _is_checkpoint(p: Path) -> bool:
    return p.exists() and (p.is_dir() or p.name.endswith((".safetensors", ".index.json")))


def _build_for_profile(args: argparse.Namespace, backend: str) -> tuple[nn.Module, Sizing, str]:
    from offload_lab.model import synthetic

    p = Path(args.model)
    if _is_checkpoint(p):
        model = synthetic.load(p, mmap=True)
        n = {g: len(model.get_submodule(g)) for g in synthetic.spec_of(model).group_names}
        tokens = _tokens(synthetic.spec_of(model), args.tokens) or (8192 if backend == "cuda" else 256)
        size = Sizing(float(model.offload_spec_meta.get("scale", 1.0)), n, tokens,
                      64 if backend == "cpu" else 512, [f"checkpoint {str(p)!r}, memory-mapped"])
        return model, size, "loaded"
    spec, _ = resolve_spec(args.model)
    size = choose_size(spec, backend, scale=args.scale, layers=args.layers,
                       tokens=_tokens(spec, args.tokens))
    return synthetic.build(spec, scale=size.scale, layers=size.layers), size, "built"


def _check_profile_model(args: argparse.Namespace) -> None:
    """Refuse a MODEL (or a ``--tokens`` it cannot read) before any output is looked at."""
    from offload_lab.model.checkpoints import read_checkpoint

    p = Path(args.model)
    if _is_checkpoint(p):
        if args.scale is not None or args.layers is not None:
            raise CliError(f"--scale / --layers do not apply to a checkpoint ({args.model!r}); "
                           f"they size models built from a catalog name or spec JSON")
        read_checkpoint(p)  # the headers, as the load reads them; --tokens is read with the model
    else:
        spec, _ = resolve_spec(args.model)
        _tokens(spec, args.tokens)


def cmd_profile(args: argparse.Namespace) -> int:
    """``offload-lab profile MODEL --out RUN.zip``: a measured run of a synthetic model.

    Under ``torchrun --nproc-per-node N`` every rank profiles its own copy of the model under
    its share of the node's host memory, and rank 0 saves the gathered multi-rank run (and the
    ``--report``).

    >>> import tempfile, pathlib
    >>> from offload_lab.cli.app import build_parser
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "tiny.zip"
    >>> cmd_profile(build_parser().parse_args(["profile", "wan2.1-t2v-1.3b", "--scale", "0.02",
    ...     "--layers", "1", "--tokens", "16", "-n", "1", "--warmup", "0", "--backend", "cpu",
    ...     "--out", str(out)]))  # doctest: +ELLIPSIS
    sizing: ...
    saved ...tiny.zip
    0
    """
    if getattr(args, "pipeline", None) is not None:
        from offload_lab.cli.pipeline import profile_pipeline

        return profile_pipeline(args)
    if args.model is None:
        raise CliError("profile needs MODEL (a catalog name, spec JSON or synthetic checkpoint) or --pipeline DIR")
    from offload_lab.cli import distributed

    # the inputs first (a corrupt MODEL is reported as such), then the outputs, then the work
    _check_profile_model(args)
    backend = _resolve_backend(args.backend)
    out = check_output(args.out, args.force, inputs=[args.model], suffix=".zip")
    report_out = (check_output(args.report, args.force, inputs=[args.model], suffix=".html")
                  if getattr(args, "report", None) else None)
    ranks = distributed.launched()
    if ranks is None:
        return _profile_here(args, backend, out, report_out, None)
    with distributed.session(ranks, backend):
        return _profile_here(args, backend, out, report_out, ranks)


def _profile_here(args: argparse.Namespace, backend: str, out: Path, report_out: Path | None,
                  ranks: Any) -> int:
    """Profile on this process (one rank of several when ``ranks`` is given); save on rank 0."""
    from offload_lab.model import synthetic
    from offload_lab.record.runtime import profile

    threads = _set_threads(backend, args.threads)
    t0 = time.perf_counter()
    model, size, verb = _build_for_profile(args, backend)
    if threads:
        size.why.append(threads)
    for line in size.why:
        _say(f"sizing: {line}")
    _say(f"{verb} {size.describe()} in {time.perf_counter() - t0:.1f} s")
    if ranks is not None:
        _say(f"ranks: {ranks.world_size} under torchrun; each plans against its share of the node's host memory")
    spec = synthetic.spec_of(model)
    p = _make_plan(spec, args)
    _say(f"plan: {p.summary()}")
    for w in p.warnings:
        _say(f"warning: {_one_line(w)}")
    steps = args.steps or 3
    device = ("cuda" if ranks is None else ranks.device) if backend == "cuda" else "cpu"
    inputs = synthetic.example_inputs(model, tokens=size.tokens, text_tokens=size.text_tokens, device=device)
    bar = Progress(steps + args.warmup)
    bar.stage(f"profiling on {backend}")
    run = profile(model, lambda: model(**inputs), p, steps=steps, warmup=args.warmup, backend=backend,
                  device=device if ranks is not None else None, init=args.init, label=args.label,
                  progress=bar.steps(f"profiling on {backend}"), gather=ranks is not None,
                  issue=args.issue)
    bar.close()
    if run is None:  # another rank than 0: rank 0 holds the gathered run
        return 0
    with cleaned_up(out):
        path = run.save(out)
    _say(_comparison_text([run]))
    if backend == "cpu":
        _say(_CPU_NOTE.format(here="", where=" (offload-lab simulate)"))
    _say(f"saved {path.resolve()}")
    if report_out is not None:
        from offload_lab.views.report import report

        with cleaned_up(report_out):
            _say(f"report {report(run).save(report_out).resolve()}")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    """``offload-lab simulate MODEL --device NAME``: a simulated run, labelled so.

    >>> from offload_lab.cli.app import build_parser
    >>> cmd_simulate(build_parser().parse_args(["simulate", "wan2.1-t2v-14b", "--device", "h200",
    ...                                         "-n", "1", "--tier", "pinned"]))  # doctest: +ELLIPSIS
    host: hypothetical: ...
    ...(simulated): ... per step (SIMULATED on the ... profile 'h200', not measured)
    ...
    0
    """
    from offload_lab.analysis import summary as analysis
    from offload_lab.simulation import simulate
    from offload_lab.views.text import fmt_percent, fmt_ratio, fmt_seconds

    spec, _ = resolve_spec(args.model)
    profile = _device_profile(args.device)
    if args.tokens is None and not spec.meta.get("tokens"):
        raise CliError(f"MODEL {args.model!r} names no token count (only catalog specs do); "
                       f"pass --tokens N, e.g. --tokens 32760")
    if args.tokens is not None:
        from offload_lab.model.flops import resolve_tokens

        resolve_tokens(spec, args.tokens)  # a bad resolution fails before any output
    k = getattr(args, "ranks_per_node", 1)
    if k > 1:  # the node's host is shared: each rank plans against its 1/k
        from offload_lab.planning.hostmem import HostMemory, resolve_host

        node = resolve_host(args.host if args.host is not None else SIM_HOST)
        args.host = HostMemory.from_dict({**node.to_dict(), "shared_by": k, "local_rank": 0})
    p = _make_plan(spec, args, host=SIM_HOST)
    # every input is read and the plan made before the output is looked at
    out = None
    if args.out is not None:
        out = check_output(args.out, args.force, inputs=[args.model, args.device], suffix=".zip")
    _say(_host_line(p))
    _say(f"plan: {p.summary()}")
    for w in p.warnings:
        _say(f"warning: {_one_line(w)}")
    run = simulate(p, profile, steps=args.steps or 3, tokens=args.tokens, label=args.label,
                   warmup=args.warmup, passes=args.passes, ranks_per_node=k,
                   issue=args.issue)
    if k > 1:
        from offload_lab.analysis.ranks import slowest_rank_run

        _say(f"node: {k} ranks copying at once; pageable and mapped staging share the host memory bus "
             f"(an estimate: {'; '.join(run.meta['estimates'])})")
        run_view = slowest_rank_run(run)
    else:
        run_view = run
    m = analysis.metrics(run_view)
    kind = profile.provenance.get("kind", "estimated")
    _say(f"{display_label(run)}: {fmt_seconds(m['step_s'])} per step (SIMULATED on the {kind} profile "
         f"{profile.name!r}, not measured)")
    _say(f"  stall {fmt_seconds(m['stall_s'])}, exposed copy {fmt_seconds(m['exposed_copy_s'])}, overlap "
         f"{fmt_percent(m['overlap'])}, {fmt_ratio(m['vs_bound'])} its {m['bound']['limit']}-bound of "
         f"{fmt_seconds(m['bound_s'])}")
    _say_orders(run, p, profile, args, k)
    if out is not None:
        with cleaned_up(out):
            path = run.save(out)
        _say(f"saved {path.resolve()}")
    return 0


def _say_orders(run: Run, p: Plan, profile: Any, args: argparse.Namespace, k: int) -> None:
    """The prediction under both issue orders, each with what it rests on, when the plan streams
    pageable, mapped or staged layers (the order does not change an all-pinned plan)."""
    from offload_lab.simulation import simulate
    from offload_lab.simulation.evidence import streams_host_blocking
    from offload_lab.views.text import fmt_seconds

    if k > 1 or not streams_host_blocking(run):
        ev = run.meta.get("evidence") or {}
        _say(f"  evidence: {_evidence_head(ev)} — {ev.get('basis', 'none recorded')}")
        return
    other = "before-compute" if run.meta["issue"] == "after-compute" else "after-compute"
    twin = simulate(p, profile, steps=args.steps or 3, tokens=args.tokens, warmup=args.warmup,
                    passes=args.passes, issue=other)
    by_order = {r.meta["issue"]: r for r in (run, twin)}
    _say("  both issue orders (the plan streams copies that block the host or are staged):")
    rows = [[o + (" (this run)" if o == run.meta["issue"] else ""), fmt_seconds(by_order[o].step_time),
             _evidence_head(by_order[o].meta.get("evidence") or {})] for o in ("after-compute", "before-compute")]
    import pandas as pd

    table = text_table(pd.DataFrame(rows, columns=["issue order", "step", "evidence"]), right=("step",))
    for line in table.splitlines():
        _say(f"    {line}")
    for o in ("after-compute", "before-compute"):
        _say(f"    {o}: {(by_order[o].meta.get('evidence') or {}).get('basis', 'no evidence recorded')}")


def _evidence_head(ev: dict[str, Any]) -> str:
    from offload_lab.simulation.evidence import UNCONFIRMED_TEXT

    status, band = ev.get("status"), ev.get("band")
    if status == "held-out" and isinstance(band, (int, float)):
        return f"held-out ± {band * 100:.1f} %"
    if status == "unconfirmed":
        return UNCONFIRMED_TEXT
    if status == "derived":
        return "derived — no measured run of this device"
    return "no evidence recorded"


def _device_profile(text: str) -> Any:
    from offload_lab.simulation import DeviceProfile, names

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


def _run_paths(items: Sequence[str]) -> list[Path]:
    paths: list[Path] = []
    for item in items:
        p = Path(item)
        if not item.strip():
            raise CliError("run '' is empty; accepted: RUN.zip files written by offload-lab profile / "
                           "simulate or Run.save, or directories of them")
        if p.is_dir():
            found = sorted(p.glob("*.zip"))
            if not found:
                raise CliError(f"directory {item!r} holds no saved runs (*.zip); accepted: RUN.zip files "
                               f"written by offload-lab profile / simulate or Run.save")
            paths += found
        elif not p.exists():
            raise CliError(f"run {item!r} does not exist; accepted: RUN.zip files written by "
                           f"offload-lab profile / simulate or Run.save, or directories of them")
        elif kind_of(p) != REGULAR:
            # reading a FIFO would wait for a writer forever
            raise CliError(f"run {item!r} is a {kind_of(p)}, not a file; accepted: RUN.zip files "
                           f"written by offload-lab profile / simulate or Run.save, or directories of them")
        else:
            paths.append(p)
    return paths


def _load_one(path: Path) -> Run:
    """A saved run, or a torch.profiler / Kineto trace (read as a run of backend ``trace``)."""
    from offload_lab.record.run import Run

    if path.name.endswith((".json", ".json.gz")):
        from offload_lab.record.kineto import from_torch_profiler

        return from_torch_profiler(path)
    return Run.load(path)


def _write_report(runs: list[Run], out: str | os.PathLike, plan: Plan | None, title: str | None,
                  recommendation: Any = None) -> Path:
    from offload_lab.views.report import report

    try:
        with cleaned_up(Path(out)):
            return report(runs, plan=plan, title=title, recommendation=recommendation).save(out)
    except ImportError as e:
        # plotly is imported when the first figure is drawn; a GPU box may lack it
        if (e.name or "").split(".")[0] == "plotly":
            raise CliError("cannot write the report: plotly is not installed here "
                           "(pip install plotly)") from None
        raise


def cmd_report(args: argparse.Namespace) -> int:
    """``offload-lab report RUN.zip ...``: one offline HTML report.

    >>> import tempfile, pathlib, offload_lab
    >>> from offload_lab.cli.app import build_parser
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> p = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> _ = offload_lab.simulate(p, "h200", steps=1).save(d / "sim.zip")
    >>> cmd_report(build_parser().parse_args(["report", str(d / "sim.zip"),
    ...                                       "--out", str(d / "r.html")]))  # doctest: +ELLIPSIS
    run ...
    report: ...r.html
    0
    """
    paths = _run_paths(args.runs)
    runs = [_load_one(p) for p in paths]
    plan = None
    if args.plan:
        from offload_lab.planning.planner import Plan, PlanError
        from offload_lab.reading import MAX_JSON_BYTES, read_text

        accepted = "accepted: the output of offload-lab plan MODEL --json"
        if kind_of(args.plan) not in (REGULAR, None):
            raise CliError(f"--plan {args.plan!r} is a {kind_of(args.plan)}, not a file; {accepted}")
        try:
            # a regular file of at most 64 MiB: a FIFO or /dev/zero is refused unread
            plan = Plan.from_json(read_text(args.plan, "--plan file", MAX_JSON_BYTES,
                                            accepted="the output of offload-lab plan MODEL --json, "
                                                     "a regular file of at most 64 MiB"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CliError(f"--plan {args.plan!r} is not JSON ({e}); {accepted}") from None
        except (PlanError, KeyError, TypeError) as e:
            why = str(e) if isinstance(e, PlanError) else "not an offload-lab plan"
            raise CliError(f"--plan {args.plan!r}: {why}; {accepted}") from None
    # the output is looked at once every input has been read: a corrupt run is reported as such
    out = check_output(args.out, args.force, inputs=[*paths, *([args.plan] if args.plan else [])])
    path = _write_report(runs, out, plan, args.title)
    _say(_comparison_text(runs))
    _say(f"report: {path.resolve()}")
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    """``offload-lab catalog [NAME] [--devices]``: the shipped models and device profiles.

    >>> from offload_lab.cli.app import build_parser
    >>> cmd_catalog(build_parser().parse_args(["catalog", "--devices"]))  # doctest: +ELLIPSIS
    device ...
    h200 ...
    0
    """
    from offload_lab import simulation as sim
    from offload_lab.model import catalog

    if args.name is not None and not args.name.strip():
        raise CliError(f"catalog NAME '' is empty; accepted: one of {', '.join(catalog.names())}, "
                       f"or no NAME to list them all")
    if args.devices:
        if args.name:
            raise CliError("catalog takes a model NAME or --devices, not both")
        # bandwidths are rates: GB/s in the header, plain numbers in the rows
        _say(f"{'device':<16} {'pinned':>8} {'pageable':>8} {'mapped':>8} {'TFLOP/s':>8}  compute  profile")
        _say(f"{'':<16} {'GB/s':>8} {'GB/s':>8} {'GB/s':>8}")
        nan = float("nan")
        for name in sim.names():
            d = sim.DeviceProfile.load(name)
            bw = d.bandwidths
            mapped = bw.get("mapped_warm", bw.get("mapped_cold", nan))
            tf = f"{d.tflops:.0f}" if d.tflops else "-"
            _say(f"{name:<16} {bw.get('pinned', nan):>8.1f} {bw.get('pageable', nan):>8.1f} {mapped:>8.1f} "
                 f"{tf:>8}  {d.compute_mode:<7}  {d.provenance.get('kind')}: {d.provenance.get('machine', '')}")
        _say("bandwidths in GB/s (1e9 bytes/s), host to device; use with offload-lab simulate MODEL --device NAME")
        return 0
    if args.name:
        return _catalog_details(catalog.load(args.name))
    rows = []
    for name in catalog.names():
        s = catalog.load(name)
        rows.append((name, str(s.meta.get("display_name", "")),
                     ", ".join(f"{g.name} ×{g.num_layers}" for g in s.groups),
                     str(sum(g.num_layers for g in s.groups)), format_bytes(s.layer_bytes),
                     format_bytes(s.total_bytes)))
    head = ("name", "model", "groups", "layers", "layer bytes", "total")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        _say("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    _say(f"device profiles: {', '.join(sim.names())} (offload-lab catalog --devices)")
    return 0


def _catalog_details(spec: ModelSpec) -> int:
    from offload_lab.model import flops

    meta = spec.meta
    _say(f"{spec.name}: {meta.get('display_name', spec.name)} (arch {meta.get('arch', '?')})")
    for g in spec.groups:
        sizes = sorted({layer.bytes for layer in g.layers})
        each = format_bytes(sizes[0]) if len(sizes) == 1 else f"{format_bytes(sizes[0])}–{format_bytes(sizes[-1])}"
        _say(f"  group {g.name}: {g.num_layers} layers × {each} ({g.block_class or 'block'}), "
             f"{format_bytes(g.bytes)}")
    dtypes = sorted({t.dtype for t in spec.tensors()})
    _say(f"  layer weights {format_bytes(spec.layer_bytes)}, non-layer {format_bytes(spec.non_layer_bytes)}, "
         f"total {format_bytes(spec.total_bytes)}; checkpoint views (mapped) {format_bytes(spec.mapped_bytes)}; "
         f"dtypes {', '.join(dtypes)}")
    tokens = meta.get("tokens") or {}
    if tokens:
        _say(f"  tokens: {', '.join(f'{k} {v:,}' for k, v in tokens.items())}; text tokens "
             f"{meta.get('text_tokens', '-')}; default {meta.get('default_steps', '-')} steps × "
             f"{meta.get('guidance_passes', 1)} guidance passes")
        res = min(tokens, key=tokens.get)
        try:
            per = {g.name: flops.layer_flops(spec, g.name, res) for g in spec.groups}
            _say(f"  FLOPs per layer forward at {res}: "
                 + ", ".join(f"{g} {v / 1e12:.2f} TFLOP" for g, v in per.items())
                 + f"; per step {flops.step_flops(spec, res) / 1e15:.2f} PFLOP")
        except ValueError:
            pass  # a spec the FLOPs model cannot read still lists its bytes
    dims = meta.get("dims") or {}
    if dims:
        _say("  dims: " + ", ".join(f"{k} {v}" for k, v in dims.items() if not isinstance(v, dict)))
    _say(f"try: offload-lab plan {spec.name} --pin-budget 8GiB  |  offload-lab simulate {spec.name} --device h200")
    return 0


