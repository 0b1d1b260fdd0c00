"""The options every surface shares: tiers, orders, residencies, backends, init strategies,
the bounds of run lengths, and the parsers that read them from text.

The ``offload-lab`` command, ``%offload_profile`` and :class:`~offload_lab.PlanExplorer` accept
the same values with the same spellings, because they all read them here; a command-line parser
gets the plan options (with the same short options as the magic) from
:func:`add_plan_arguments` and the run options from :func:`add_run_arguments`.

>>> parse_resident("blocks.0,blocks.3"), parse_order("largest"), parse_tokens("480p")
(['blocks.0', 'blocks.3'], 'largest', '480p')
>>> parse_budget("all") is None, parse_budget("8GiB") == 8 * 2**30
(True, True)
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import Any

from offload_lab import vocabulary
from offload_lab.errors import OffloadLabError
from offload_lab.units import SizeError, parse_size

__all__ = [
    "TIERS", "FORCED_TIERS", "ORDERS", "ISSUE_ORDERS", "RESIDENCIES", "STRATEGIES", "BACKENDS",
    "MAX_STEPS", "MAX_TOKENS", "MAX_PASSES", "MAX_PREFETCH", "MAX_LAYERS", "OptionError",
    "parse_budget", "parse_count", "parse_tokens", "parse_resident", "parse_order",
    "parse_tiers", "parse_choice", "argparse_type", "add_plan_arguments", "add_run_arguments", "plan_kwargs",
]

# the names themselves live in offload_lab.vocabulary; these are the surfaces' spellings of them
TIERS = vocabulary.TIERS
FORCED_TIERS = vocabulary.FORCED_TIERS
ORDERS = vocabulary.ORDERS
ISSUE_ORDERS = vocabulary.ISSUE_ORDERS
RESIDENCIES = vocabulary.RESIDENCIES
STRATEGIES = vocabulary.INIT_STRATEGIES
BACKENDS = vocabulary.BACKENDS
#: run lengths past these are refused: a simulated step holds every interval in memory, and a
#: run or a token count this large is a typo far more often than a wish
MAX_STEPS = 1000
MAX_TOKENS = 10_000_000
MAX_PASSES = 16
MAX_PREFETCH = 64
MAX_LAYERS = 10_000
#: pin-budget words meaning "everything the host can spend"
_ALL = ("all", "auto", "none")
_LAYER_ID = re.compile(r"\d+|[A-Za-z_][\w.]*\.\d+")


class OptionError(OffloadLabError, ValueError):
    """An option value no surface accepts; the message names it and what is accepted."""


def parse_choice(text: Any, what: str, accepted: Sequence[str]) -> str:
    """``text`` when it is one of ``accepted`` (case and spaces ignored).

    >>> parse_choice(" Pinned", "tier", FORCED_TIERS)
    'pinned'
    """
    t = str(text).strip().lower()
    if t not in accepted:
        raise OptionError(f"{what} {text!r} is not one of {', '.join(accepted)}")
    return t


def parse_budget(text: Any) -> int | None:
    """A pin budget: a size (``8GiB``), or ``all`` / ``auto`` / ``none`` for everything the host
    can spend (``None``).

    >>> parse_budget("512MiB"), parse_budget(None)
    (536870912, None)
    """
    if text is None or (isinstance(text, str) and text.strip().lower() in _ALL):
        return None
    try:
        return parse_size(text, "pin budget")
    except SizeError as e:
        raise OptionError(f"{e}, or 'all' for everything the host can spend") from None


def parse_count(text: Any, what: str, lo: int, hi: int) -> int:
    """An integer in ``lo..hi``.

    >>> parse_count("3", "steps", 1, MAX_STEPS)
    3
    """
    try:
        n = int(str(text).strip())
    except ValueError:
        raise OptionError(f"{what} {text!r} is not an integer; expected an int in {lo}..{hi}") from None
    if not lo <= n <= hi:
        raise OptionError(f"{what} {text!r} is out of range; expected an int in {lo}..{hi}")
    return n


def parse_tokens(text: Any) -> int | str:
    """Video tokens: a count ``1..MAX_TOKENS``, or a resolution name (``480p``) that the
    model's spec resolves.

    >>> parse_tokens("32760"), parse_tokens("720P")
    (32760, '720p')
    """
    t = str(text).strip()
    if not t:
        raise OptionError("tokens '' is empty; expected an int or a resolution such as 480p")
    if t.lstrip("+-").isdigit():
        return parse_count(t, "tokens", 1, MAX_TOKENS)
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", t):
        raise OptionError(f"tokens {text!r} is not a count nor a resolution name such as 480p")
    return t.lower()


def _ids(text: str, what: str) -> list[int | str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in items if not _LAYER_ID.fullmatch(s)]
    if not items or bad:
        raise OptionError(f"{what} {text!r} is not a list of layer ids such as 3,1,0 or "
                          f"blocks.3,blocks.1")
    return [int(s) if s.isdigit() else s for s in items]


def parse_resident(text: Any) -> int | float | list[int | str]:
    """Layers kept on the device: a count per group (``35``), a fraction of each group
    (``0.5``), or layer ids (``0,1`` or ``blocks.0,blocks.1``).

    >>> parse_resident("35"), parse_resident("0.5"), parse_resident("0,1")
    (35, 0.5, [0, 1])
    """
    if text is None:
        return 0
    t = str(text).strip()
    if re.fullmatch(r"\d+", t):
        return parse_count(t, "resident", 0, MAX_LAYERS)
    if re.fullmatch(r"\d*\.\d+", t):
        f = float(t)
        if f > 1:
            raise OptionError(f"resident {text!r} is not a fraction in (0, 1]; write a count as "
                              f"an int")
        return f
    if not t:
        raise OptionError("resident '' is empty; accepted: a count (35), a fraction (0.5) or "
                          "layer ids (0,1 or blocks.0,blocks.1)")
    try:
        return _ids(t, "resident")
    except OptionError:
        raise OptionError(f"resident {text!r} is not a count (35), a fraction (0.5) or layer ids "
                          f"(0,1 or blocks.0,blocks.1)") from None


def parse_order(text: Any) -> str | list[int | str]:
    """Who gets pins first: a policy (``execution``, ``reverse``, ``largest``, ``strided``) or
    layer ids (``3,1,2``).

    >>> parse_order("3,1,2"), parse_order("reverse")
    ([3, 1, 2], 'reverse')
    """
    t = str(text).strip()
    if t.lower() in ORDERS:
        return t.lower()
    try:
        return _ids(t, "order")
    except OptionError:
        raise OptionError(f"order {text!r} is not one of {', '.join(ORDERS)} or a comma-separated "
                          f"list of layer ids such as 3,1,2 or blocks.3,blocks.1") from None


def parse_tiers(text: Any) -> list[str]:
    """A comma-separated list of forced tiers, each at most once (``pinned,pageable``).

    >>> parse_tiers("pinned, pageable")
    ['pinned', 'pageable']
    """
    tiers = [t.strip().lower() for t in str(text).split(",") if t.strip()]
    bad = [t for t in tiers if t not in FORCED_TIERS]
    if bad or not tiers:
        raise OptionError(f"tiers {text!r}: {', '.join(bad) or 'none given'} not accepted; expected "
                          f"a comma-separated list of {', '.join(FORCED_TIERS)} (e.g. pinned,pageable)")
    if len(set(tiers)) != len(tiers):
        raise OptionError(f"tiers {text!r} lists a tier twice; expected each at most once")
    return tiers


# -- argparse ------------------------------------------------------------------------------------
def argparse_type(fn: Callable[..., Any], name: str, *args: Any) -> Callable[[str], Any]:
    """``fn(text, *args)`` as an argparse type: an :class:`OptionError` becomes argparse's own
    one-line message (argparse would otherwise say only "invalid value").

    >>> p = argparse.ArgumentParser()
    >>> _ = p.add_argument("--tiers", type=argparse_type(parse_tiers, "tiers"))
    >>> p.parse_args(["--tiers", "pinned,mapped"]).tiers
    ['pinned', 'mapped']
    """
    def parse(text: str) -> Any:
        try:
            return fn(text, *args)
        except OptionError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = name  # argparse names the type in its messages
    return parse


def _size_arg(what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return parse_size(text, what)
        except SizeError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = what
    return parse


def add_plan_arguments(parser: Any, host_help: str | None = "default: probe this machine") -> Any:
    """Add the plan options (``-b/--pin-budget``, ``--host``, ``--resident``, ``--residency``,
    ``--order``, ``-p/--prefetch``, ``--tier``) to an argparse parser; returns their group.
    ``host_help=None`` leaves ``--host`` out (a surface that runs on this machine plans for it).

    >>> p = argparse.ArgumentParser(); _ = add_plan_arguments(p)
    >>> p.parse_args(["-b", "8GiB", "-p", "2"]).prefetch
    2
    """
    g = parser.add_argument_group("plan options")
    g.add_argument("-b", "--pin-budget", type=argparse_type(parse_budget, "pin budget"), metavar="SIZE",
                   help="most host memory to page-lock, e.g. 8GiB (default or 'all': everything "
                        "the host can spend)")
    if host_help is not None:
        g.add_argument("--host", type=_size_arg("host"), metavar="SIZE",
                       help=f"plan for a hypothetical host with SIZE available, e.g. 64GiB ({host_help})")
    g.add_argument("--resident", type=argparse_type(parse_resident, "resident"), default=0,
                   metavar="N|FRACTION|IDS",
                   help="layers kept on the device: a count per group, a fraction such as 0.5, "
                        "or layer ids such as 0,1 or blocks.0,blocks.1 (default 0)")
    g.add_argument("--residency", type=argparse_type(parse_choice, "residency", "residency", RESIDENCIES),
                   default="leading", metavar="|".join(RESIDENCIES),
                   help="which layers a resident count keeps: the first ones or spread evenly "
                        "(default leading)")
    g.add_argument("--order", type=argparse_type(parse_order, "order"), default="execution",
                   metavar="POLICY|IDS",
                   help=f"who gets pins first: {', '.join(ORDERS)} (bit-reversal: 0, the middle, the "
                        f"quarters, ...), or ids such as 3,1,2 (default execution)")
    g.add_argument("-p", "--prefetch", type=argparse_type(parse_count, "prefetch", "prefetch", 0, MAX_PREFETCH),
                   default=1, metavar="N",
                   help="streamed layers in flight ahead of the running one (default 1; 0 = load at use)")
    g.add_argument("--tier", type=argparse_type(parse_choice, "tier", "tier", FORCED_TIERS), default=None,
                   metavar="|".join(FORCED_TIERS),
                   help="force every streamed layer into one tier (default: the planner's choice)")
    g.add_argument("--staging", action="store_true",
                   help="layers without a pin of their own go through prefetch+1 pinned staging buffers "
                        "per group when those fit the pin budget (tier staged)")
    return g


def add_run_arguments(parser: Any, steps_default: int | None = None, backend: bool = True,
                      warmup_default: int | None = 1) -> Any:
    """Add the run options (``-n/--steps``, ``--warmup``, and with ``backend`` also
    ``--backend``) to an argparse parser; returns their group.

    >>> p = argparse.ArgumentParser(); _ = add_run_arguments(p, steps_default=3)
    >>> p.parse_args(["-n", "5"]).steps, p.parse_args([]).backend
    (5, 'auto')
    """
    g = parser.add_argument_group("run options")
    default = "" if steps_default is None else f" (default {steps_default})"
    g.add_argument("-n", "--steps", type=argparse_type(parse_count, "steps", "steps", 1, MAX_STEPS),
                   default=steps_default, metavar="N",
                   help=f"measured steps per run, at most {MAX_STEPS}{default}")
    g.add_argument("--warmup", type=argparse_type(parse_count, "warmup", "warmup", 0, MAX_STEPS),
                   default=warmup_default, metavar="N",
                   help="steps run first and dropped (default "
                        + ("chosen" if warmup_default is None else str(warmup_default)) + ")")
    if backend:
        g.add_argument("--backend", type=argparse_type(parse_choice, "backend", "backend", BACKENDS),
                       default="auto", metavar="|".join(BACKENDS),
                       help="cuda when a GPU is there, else cpu (default auto)")
    g.add_argument("--issue", type=argparse_type(parse_choice, "issue", "issue", ISSUE_ORDERS),
                   default="after-compute", metavar="|".join(ISSUE_ORDERS),
                   help="when copies that block the host are issued: behind the running block's kernels, "
                        "or before them as other runtimes do (default after-compute)")
    return g


def plan_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The :func:`offload_lab.plan` arguments the plan options stand for (host aside).

    >>> p = argparse.ArgumentParser(); _ = add_plan_arguments(p)
    >>> plan_kwargs(p.parse_args(["--tier", "pinned"]))["tier"]
    'pinned'
    """
    return {"pin_budget": args.pin_budget, "resident": args.resident, "residency": args.residency,
            "order": args.order, "prefetch": args.prefetch, "tier": args.tier,
            "staging": bool(getattr(args, "staging", False))}
