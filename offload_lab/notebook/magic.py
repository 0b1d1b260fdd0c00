"""``%offload_profile``: profile a statement under layer-wise offload from a notebook cell.

``%load_ext offload_lab`` registers one magic that works as a line and as a cell magic::

    %offload_profile [options] MODEL STATEMENT      # STATEMENT is one step
    %%offload_profile [options] MODEL               # the cell body is one step
    ...

``MODEL`` is an expression naming a ``torch.nn.Module`` in the notebook (``model``,
``pipe.transformer``); the plan is made from it with this machine's host memory. The magic
displays a summary table and the timeline as one bundle with ``text/html`` and
``text/plain``; ``-o`` returns the Run (a list of Runs with ``--tiers``), ``-q`` displays
nothing; ``-h`` (like ``%offload_profile?``) shows the help. The plan and run options are the
``offload-lab`` command's, with the same values and short options (``-b``, ``-p``, ``-n``). Ctrl-C stops the profile: the model is restored and nothing is recorded. An error in
the statement is shown as the user's own traceback (no toolkit frames) and fails the cell.

>>> from IPython.testing.globalipapp import start_ipython            # doctest: +SKIP
>>> ip = start_ipython(); ip.run_line_magic("load_ext", "offload_lab")  # doctest: +SKIP
>>> run = ip.run_line_magic("offload_profile", "-q -o -n 2 model model(**inputs)")  # doctest: +SKIP

This module imports IPython (it only runs inside one) but neither plotly nor ipywidgets at
import time; figures are built when a result is displayed.
"""

from __future__ import annotations

import html
import linecache
import os
import re
import textwrap
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import ArgDecorator, argument, magic_arguments

import offload_lab
from offload_lab.errors import OffloadLabError
from offload_lab.model.load import spec_of
from offload_lab.model.pipeline import is_pipeline
from offload_lab.notebook.display import figure_html
from offload_lab.notebook.models import spec_for_model
from offload_lab.planning.options import (
    STRATEGIES,
    add_plan_arguments,
    add_run_arguments,
    argparse_type,
    parse_choice,
    parse_tiers,
    plan_kwargs,
)
from offload_lab.planning.pipeline import plan_pipeline
from offload_lab.planning.planner import plan
from offload_lab.record.steps import scheduler_of
from offload_lab.views import figures as viz
from offload_lab.views.report import report

if TYPE_CHECKING:
    from torch import nn

    from offload_lab.model.spec import ModelSpec
    from offload_lab.planning.planner import Plan
    from offload_lab.record.run import Run

__all__ = ["OffloadMagics", "load_ipython_extension", "summary_bundle", "user_traceback", "MagicArgumentError"]

_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent) + os.sep  # the offload_lab package
_CPU_NOTE = ("cpu backend: there is no DMA engine and no page-locking on a CPU, so pinned, pageable "
             "and mapped runs take about the same time here; the pinned-vs-pageable difference is "
             "measured on a GPU in the before-compute order (the shipped H200 runs), and "
             "offload_lab.simulate predicts both orders on a device profile (after-compute: unconfirmed).")


class MagicArgumentError(OffloadLabError, UsageError, ValueError):
    """A bad option value for ``%offload_profile``; IPython shows it as a one-line usage error.

    >>> MagicArgumentError("--steps 0 is below 1")._render_traceback_()
    ['UsageError: --steps 0 is below 1']
    """

    def _render_traceback_(self) -> list[str]:
        # IPython prints only exact UsageErrors on one line; a subclass asks for it this way
        return [f"UsageError: {self}"]


# -- option parsing -------------------------------------------------------------------------------
_QUOTED = re.compile(r"""\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\S+)""")


def _tokens(text: str) -> list[tuple[str, int]]:
    """Whitespace-separated tokens (quotes kept together and removed) with their end offsets."""
    out, pos = [], 0
    while True:
        m = _QUOTED.match(text, pos)
        if not m:
            return out
        tok = m.group(1)
        if len(tok) >= 2 and tok[0] == tok[-1] and tok[0] in "'\"":
            tok = tok[1:-1]
        out.append((tok, m.end()))
        pos = m.end()


def _terminal_help(doc: str) -> str:
    """The magic's docstring as ``-h`` prints it, opening with ``usage: %offload_profile ...``.

    IPython's ``magic_arguments`` starts the docstring with a reST ``::`` literal-block marker
    and an indented usage, which are for Sphinx; a reader of ``-h`` wants the usage line first.

    >>> print(_terminal_help("::\\n\\n  %m [-a]\\n       [-b]\\n\\nDoes m."))
    usage: %m [-a]
              [-b]
    <BLANKLINE>
    Does m.
    """
    head, sep, rest = doc.partition("\n\n")
    if head.strip() != "::" or not sep:
        return doc
    usage, _, body = rest.partition("\n\n")
    lines = textwrap.dedent(usage).splitlines()
    if not lines:
        return body
    prog = lines[0].split(" ", 1)[0]
    pad = " " * (len("usage: ") + len(prog) + 1)
    out = [f"usage: {lines[0]}", *(pad + line.strip() for line in lines[1:])]
    return "\n".join(out) + "\n\n" + body


class _HelpRequested(Exception):
    """``-h`` / ``--help`` among the options: show the help instead of profiling."""


class _shared_options(ArgDecorator):
    """The plan and run options of every surface (:mod:`offload_lab.planning.options`)."""

    def add_to_parser(self, parser: Any, group: Any) -> None:
        # the magic profiles on this machine, so it plans for this machine's host: no --host
        add_plan_arguments(parser, host_help=None)
        add_run_arguments(parser, steps_default=3)


def _split_line(parser: Any, line: str) -> tuple[list[str], str, str]:
    """``[options] MODEL REST`` → (option tokens, MODEL, REST exactly as typed).

    The statement is not tokenised: its quotes and spacing must reach Python untouched.
    """
    toks = _tokens(line)
    opts: list[str] = []
    i = 0
    while i < len(toks) and toks[i][0].startswith("-") and toks[i][0] != "-":
        tok = toks[i][0]
        if tok in ("-h", "--help"):
            raise _HelpRequested
        opts.append(tok)
        if tok.startswith("--"):
            name, attached = tok.split("=", 1)[0], "=" in tok
        else:
            name, attached = tok[:2], len(tok) > 2  # -b8GiB, or flags run together as -oq
        action = parser._option_string_actions.get(name)
        if action is None:
            known = sorted(o for o in parser._option_string_actions if o.startswith("-"))
            raise MagicArgumentError(f"option {tok!r} is not known; accepted: {', '.join(known)}")
        if action.nargs != 0 and not attached:
            if i + 1 >= len(toks):
                raise MagicArgumentError(f"option {tok} needs a value; see %offload_profile?")
            opts.append(toks[i + 1][0])
            i += 1
        i += 1
    if i >= len(toks):
        raise MagicArgumentError(
            "MODEL is missing: write %offload_profile [options] MODEL STATEMENT (line) or "
            "%%offload_profile [options] MODEL (cell); see %offload_profile?")
    model = toks[i][0]
    rest = line[toks[i][1]:].strip()
    return opts, model, rest


# -- tracebacks -----------------------------------------------------------------------------------
def _is_toolkit(frame: types.FrameType) -> bool:
    return frame.f_code.co_filename.startswith(_PACKAGE_DIR)


def user_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback without offload-lab's own frames (the innermost frame is always kept).

    Frames of the profiler (the step loop, hooks) sit between the notebook and the user's code;
    a user debugging their statement should not read through them.

    >>> import sys
    >>> try:
    ...     1 / 0
    ... except ZeroDivisionError:
    ...     tb = user_traceback(sys.exc_info()[2])
    >>> tb.tb_next is None
    True
    """
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    keep = [t for t in frames[:-1] if not _is_toolkit(t.tb_frame)] + frames[-1:]
    out = None
    for t in reversed(keep):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _raised_in(tb: types.TracebackType | None, filenames: set[str]) -> bool:
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in filenames:
            return True
        tb = tb.tb_next
    return False


# -- summary display ------------------------------------------------------------------------------
def summary_bundle(runs: list[Run], figures: bool = True, title: str | None = None) -> dict[str, str]:
    """The ``text/plain`` + ``text/html`` bundle the magic displays for ``runs``.

    ``text/html`` holds the comparison table, the step-time bars (several runs) and each run's
    timeline; ``text/plain`` holds the table.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> p = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> b = summary_bundle([offload_lab.simulate(p, "h200", steps=1)], figures=False)
    >>> sorted(b), "simulated" in b["text/plain"]
    (['text/html', 'text/plain'], True)
    """

    table = viz.comparison_frame(runs)
    head = title or ("offload_profile: " + (runs[0].meta.get("model") or "model"))
    notes = []
    if any(r.backend == "cpu" for r in runs) and len(runs) > 1:
        notes.append(_CPU_NOTE)
    if any(r.simulated for r in runs):
        notes.append("rows marked (simulated) are predictions of the simulator, not measurements")
    plain = head + "\n" + table.to_string(index=False) + "".join(f"\nnote: {n}" for n in notes)
    parts = [f"<div class=\"offload-profile\"><p><b>{html.escape(head)}</b></p>",
             table.to_html(index=False, escape=True, border=0)]
    parts += [f"<p style=\"color:#667085\">{html.escape(n)}</p>" for n in notes]
    if figures:
        if len(runs) > 1:
            parts.append(figure_html(viz.step_times(runs)))
        for r in runs:
            parts.append(figure_html(viz.timeline(r)))
    parts.append("</div>")
    return {"text/plain": plain, "text/html": "".join(parts)}


# -- the magic --------------------------------------------------------------------------------------
@magics_class
class OffloadMagics(Magics):
    """Holds ``%offload_profile``; registered by ``%load_ext offload_lab``."""

    @magic_arguments()
    @_shared_options()
    @argument("--tiers", "--compare", dest="tiers", type=argparse_type(parse_tiers, "tiers"), default=None,
              metavar="TIERS",
              help="one run per forced tier, then a comparison, e.g. pinned,pageable "
                   "(--compare is the same option)")
    @argument("--init", type=argparse_type(parse_choice, "init", "init", STRATEGIES), default="grouped",
              metavar="|".join(STRATEGIES), help="group initialisation strategy (default grouped)")
    @argument("--label", default=None, help="run label (default: tiers and prefetch)")
    @argument("--report", default=None, metavar="PATH",
              help="also write an offline HTML report of the run(s) to PATH")
    @argument("-o", dest="return_runs", action="store_true",
              help="return the Run (a list of Runs with --tiers)")
    @argument("-q", dest="quiet", action="store_true", help="display nothing")
    @argument("model", metavar="MODEL",
              help="expression naming the torch.nn.Module (or diffusers pipeline) to offload")
    @argument("statement", metavar="STATEMENT", nargs="*",
              help="code run once per step (line magic); the cell body in the cell magic")
    @no_var_expand  # the statement is Python: IPython must not expand {x} or $x inside it
    @line_cell_magic
    def offload_profile(self, line: str, cell: str | None = None) -> Any:
        """Profile a statement under layer-wise offload of MODEL and show where the time goes.

        Line magic: %offload_profile [options] MODEL STATEMENT
        Cell magic: %%offload_profile [options] MODEL   (the cell body is one step)

        The plan is made from MODEL's layer groups with this machine's host memory; the
        statement (evaluated in the notebook namespace) runs --warmup + --steps times under
        offload. Displays a summary table and the timeline; -o returns the Run(s); -h shows
        this help.

        MODEL may be a diffusers pipeline: the statement is then one request (``pipe(**kw)``),
        run --warmup + --steps times; one plan per component, steps found from the pipeline's
        scheduler, calls within a step (classifier-free guidance) shown.

        Examples:
          %offload_profile -n 3 model model(**inputs)
          %offload_profile --tier pinned -n 1 pipe pipe(**kw)
          %offload_profile --tiers pinned,pageable -b 8GiB model model(**inputs)
          %%offload_profile -p 2 --resident 4 model
          out = model(**inputs)
        """
        __tracebackhide__ = True  # IPython hides this frame when the user's error is shown
        parser = self.offload_profile.parser
        try:
            opts, model_expr, rest = _split_line(parser, line)
        except _HelpRequested:
            print(_terminal_help(type(self).offload_profile.__doc__ or ""))
            return None
        args = parser.parse_args([*opts, model_expr])
        if cell is None:
            if not rest:
                raise MagicArgumentError(
                    "STATEMENT is missing: write %offload_profile [options] MODEL STATEMENT, or use "
                    "the cell magic %%offload_profile [options] MODEL with the step as the cell body")
            source = rest
        else:
            if rest:
                raise MagicArgumentError(
                    f"%%offload_profile takes the step from the cell body; {rest!r} after MODEL is "
                    f"not accepted (write it in the cell)")
            source = cell
        runs, plan = self._profile_all(args, model_expr, source)
        if args.report:
            path = report(runs, plan=plan).save(args.report)
            if not args.quiet:
                print(f"report written to {path}")
        if not args.quiet:
            from IPython.display import display

            display(summary_bundle(runs), raw=True)
        if args.return_runs:
            return runs if args.tiers else runs[0]
        return None

    # -- helpers -------------------------------------------------------------------------------
    def _model(self, expr: str) -> nn.Module:
        from torch import nn

        try:
            model = eval(expr, self.shell.user_ns)  # noqa: S307 - the user's own notebook namespace
        except Exception as e:
            raise MagicArgumentError(f"MODEL {expr!r} could not be evaluated in the notebook "
                                     f"namespace: {type(e).__name__}: {e}") from None

        if not isinstance(model, nn.Module) and not is_pipeline(model):
            raise MagicArgumentError(f"MODEL {expr!r} is a {type(model).__name__}; expected a "
                                     f"torch.nn.Module whose blocks sit in nn.ModuleLists, or a "
                                     f"diffusers pipeline")
        return model

    def _compile(self, source: str) -> tuple[types.CodeType, str]:
        transformed = self.shell.transform_cell(source)
        # caching under the current cell number makes tracebacks read "Cell In[n]" with source
        name = self.shell.compile.cache(transformed, self.shell.execution_count, raw_code=source)
        try:
            return compile(transformed, name, "exec"), name
        except SyntaxError as e:
            linecache.checkcache(name)
            raise MagicArgumentError(f"STATEMENT {source.strip()!r} is not valid Python: {e.msg} "
                                     f"(line {e.lineno})") from None

    def _plan(self, spec: ModelSpec, args: Any, tier: str | None) -> Plan:
        try:
            return plan(spec, **{**plan_kwargs(args), "tier": tier})
        except ValueError as e:
            if isinstance(e, UsageError):
                raise
            raise MagicArgumentError(str(e)) from None

    def _pipeline_plan(self, pipe: Any, args: Any, tier: str | None) -> Any:
        """One plan per component of a pipeline, ranked by uses per request."""

        try:
            return plan_pipeline(spec_of(pipe), **{**plan_kwargs(args), "tier": tier})
        except ValueError as e:
            if isinstance(e, UsageError):
                raise
            raise MagicArgumentError(str(e)) from None

    def _profile_all(self, args: Any, model_expr: str, source: str) -> tuple[list[Run], Plan]:
        __tracebackhide__ = True
        from offload_lab.record.runtime import profile  # heavy: torch

        tiers = args.tiers or []
        if tiers and args.tier:
            raise MagicArgumentError(f"--tier {args.tier} and --tiers (--compare) {','.join(tiers)} "
                                     f"both force tiers; accepted: one of them")
        model = self._model(model_expr)
        if is_pipeline(model):
            # a pipeline call is one request: -n requests, steps from the pipeline's scheduler
            plans = [(t, self._pipeline_plan(model, args, t)) for t in (tiers or [args.tier])]
        else:
            spec = spec_for_model(model)
            plans = [(t, self._plan(spec, args, t)) for t in (tiers or [args.tier])]
        code, filename = self._compile(source)
        user_ns = self.shell.user_ns

        def step() -> None:
            exec(code, user_ns)  # noqa: S102 - the user's own statement, as a cell would run it

        runs = []
        for tier, p in plans:
            done = [0]
            total = args.warmup + args.steps
            label = args.label
            if label and tier:
                label = f"{label} · {tier}"
            try:
                if not is_pipeline(model) and scheduler_of(model) is not None:
                    # a component of a pipeline whose statement runs whole requests: the steps
                    # are the scheduler's, as offload(pipe.transformer) finds them
                    runs.append(_component_requests(model, step, p, args, label, done))
                    continue
                runs.append(profile(model, step, p, steps=args.steps, warmup=args.warmup,
                                    backend=args.backend, init=args.init, label=label, issue=args.issue,
                                    progress=lambda k, n, done=done: done.__setitem__(0, k),
                                    requests=args.steps))
            except KeyboardInterrupt as e:
                which = f" ({tier} run)" if tier else ""
                # runs finished before this one are dropped too: nothing is returned or shown
                msg = (f"%offload_profile stopped by Ctrl-C during step {done[0] + 1} of {total}"
                       f"{which}; the model is restored and no run was recorded")
                stop = KeyboardInterrupt(msg)
                stop._render_traceback_ = lambda m=msg: [f"KeyboardInterrupt: {m}"]
                raise stop from e
            except Exception as e:
                if not _raised_in(e.__traceback__, {filename}):
                    if isinstance(e, ValueError) and not isinstance(e, UsageError):
                        # the toolkit refused the model or plan: say why, in one line
                        raise MagicArgumentError(f"{type(e).__name__}: {e}") from None
                    raise
                self._reraise_as_user_error(e)
        first = plans[0][1]
        return runs, (first.merged() if hasattr(first, "merged") else first)

    def _reraise_as_user_error(self, e: BaseException) -> None:
        """Re-raise the statement's exception with a traceback of the user's frames only."""
        __tracebackhide__ = True
        tb = user_traceback(e.__traceback__)
        try:
            stb = self.shell.InteractiveTB.structured_traceback(type(e), e, tb, tb_offset=0)
            # IPython shows an exception's _render_traceback_() instead of its own traceback,
            # so the cell fails with the user's exception and reads like a plain cell's error
            e._render_traceback_ = lambda: stb  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            # an exception type without __dict__: show the user's frames, then fail the cell
            self.shell.showtraceback((type(e), e, tb), tb_offset=0)
            raise UsageError(f"%offload_profile: the statement raised {type(e).__name__}; "
                             f"the model is restored") from None
        raise e.with_traceback(tb)


def _component_requests(model: Any, step: Any, p: Any, args: Any, label: str | None,
                        done: list[int]) -> Run:
    """``-n`` runs of the statement under ``offload(model, plan)``, its steps the scheduler's;
    those of the ``--warmup`` runs dropped."""
    import torch

    total = args.warmup + args.steps
    # the package's lazy public name: importing the manager here would load torch with the magic
    with offload_lab.offload(model, p, backend=args.backend, init=args.init, label=label, issue=args.issue) as m:
        dropped = 0
        with torch.no_grad():
            for k in range(total):
                step()
                if k + 1 == args.warmup:
                    dropped = len(m.build_run().steps)
                done[0] = k + 1
        run = m.build_run(warmup=dropped)
    run.meta["requests"] = args.steps
    run.meta["warmup_requests"] = args.warmup
    return run


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%offload_profile`` (called by ``%load_ext offload_lab``).

    >>> from IPython.testing.globalipapp import start_ipython  # doctest: +SKIP
    >>> load_ipython_extension(start_ipython())                # doctest: +SKIP
    """
    ipython.register_magics(OffloadMagics)
