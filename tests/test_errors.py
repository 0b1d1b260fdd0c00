"""One error base, one argument checker, one vocabulary: what every surface relies on."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings

import pytest

import offload_lab
from offload_lab import checks, vocabulary
from offload_lab.checks import check_bool, check_choice, check_int, check_number
from offload_lab.cli.app import main
from offload_lab.errors import ArgumentError, OffloadLabError


def _modules() -> list[str]:
    # every module, the optional-dependency ones too (all installed here): a missing one would
    # hide its errors from the walk, so an ImportError fails the test rather than skipping it
    return [m.name for m in pkgutil.walk_packages(offload_lab.__path__, "offload_lab.")]


def _exception_classes() -> dict[str, type]:
    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in _modules():
            module = importlib.import_module(name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__.startswith("offload_lab") and issubclass(cls, BaseException):
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_every_error_class_of_the_package_is_an_offload_lab_error():
    classes = _exception_classes()
    assert len(classes) > 25  # the walk reached the whole package
    # warnings are warned, not raised; private classes are control flow caught where raised
    errors = {n: c for n, c in classes.items()
              if not issubclass(c, Warning) and not c.__name__.startswith("_")}
    stray = sorted(n for n, c in errors.items() if not issubclass(c, OffloadLabError))
    assert stray == []
    # each keeps the builtin it always was, so `except ValueError` code keeps working
    assert all(issubclass(c, (ValueError, RuntimeError, LookupError)) for c in errors.values()
               if c is not OffloadLabError)
    assert offload_lab.OffloadLabError is OffloadLabError


def test_the_cli_reports_an_offload_lab_error_in_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "bandwidths": {"pinned": -1}, "provenance": {"kind": "estimated"}}')
    # a DeviceProfile refuses the bandwidth with a ProfileError: exit 2, one line, no traceback
    assert main(["simulate", "wan2.1-t2v-1.3b", "--device", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("offload-lab: error: ")
    assert "bandwidth pinned = -1" in err and "Traceback" not in err


def test_the_cli_keeps_the_traceback_of_a_foreign_value_error(monkeypatch):
    # a ValueError that is not the library's is a bug: it must not be reduced to a line
    import offload_lab.cli.catalog_cmd as catalog_cmd

    def broken(args):
        raise ValueError("not ours")

    monkeypatch.setattr(catalog_cmd, "cmd_catalog", broken)
    with pytest.raises(ValueError, match="not ours"):
        main(["catalog"])


@pytest.mark.parametrize("call", [
    lambda: check_int("steps", True, minimum=1),
    lambda: check_int("steps", 1.0, minimum=1),
    lambda: check_number("contention", False),
    lambda: check_number("bandwidth", float("nan"), above=0),
    lambda: check_number("bandwidth", float("inf"), above=0),
    lambda: check_bool("gather", 1),
    lambda: check_choice("backend", "GPU", vocabulary.BACKENDS),
])
def test_a_bool_is_never_a_number_and_each_refusal_is_one_line(call):
    with pytest.raises(ArgumentError) as e:
        call()
    assert "\n" not in str(e.value)
    assert isinstance(e.value, OffloadLabError) and isinstance(e.value, ValueError)


def test_checks_name_the_parameter_the_value_and_what_is_accepted():
    with pytest.raises(ArgumentError, match=r"^passes = 0; accepted: an int in \[1, 64\]$"):
        check_int("passes", 0, minimum=1, maximum=64)
    with pytest.raises(ArgumentError, match=r"^step_error = 1; accepted: a number in \[0, 1\) or None$"):
        check_number("step_error", 1, minimum=0, below=1, optional=True)
    with pytest.raises(ArgumentError, match=r"^issue 'early' is not one of 'after-compute', 'before-compute'$"):
        check_choice("issue", "early", vocabulary.ISSUE_ORDERS)
    # the caller's own error class, so `except PlanError` keeps catching what plan() refuses
    with pytest.raises(offload_lab.PlanError, match=r"prefetch = -1"):
        check_int("prefetch", -1, minimum=0, error=offload_lab.PlanError)
    assert check_int("rank", None, optional=True) is None
    assert check_number("gbps", 25) == 25.0 and isinstance(check_number("gbps", 25), float)


def test_the_runtime_and_the_explorer_refuse_a_bool_step_count_alike():
    # both read steps=True as a wrong type, not as one step
    from offload_lab import synthetic
    from offload_lab.notebook.state import ExplorerError
    from offload_lab.record.runtime.manager import OffloadError

    spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    model = synthetic.build(spec, scale=0.05, layers=2)
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pinned", host=offload_lab.HostMemory(available="8GiB"))
    with pytest.raises(OffloadError, match=r"steps = True; accepted: an int ≥ 1"):
        offload_lab.profile(model, lambda: None, plan, steps=True, backend="cpu")
    with pytest.raises(ExplorerError, match=r"steps = True; accepted: an int in \[1, "):
        offload_lab.PlanExplorer(spec, profile="h200", host="64GiB", steps=True)


def test_the_vocabulary_is_the_one_every_surface_uses():
    from offload_lab.cli import calibrate
    from offload_lab.planning import options
    from offload_lab.record import observer, run, schema
    from offload_lab.record.runtime import manager
    from offload_lab.simulation import profile, recommend
    from offload_lab.views.figure_kit import TIER_COLORS

    assert options.TIERS is vocabulary.TIERS and options.FORCED_TIERS is vocabulary.FORCED_TIERS
    assert options.ORDERS is vocabulary.ORDERS and options.RESIDENCIES is vocabulary.RESIDENCIES
    assert options.STRATEGIES is manager.INIT_STRATEGIES is vocabulary.INIT_STRATEGIES
    assert options.BACKENDS is manager.BACKENDS is observer.BACKENDS is vocabulary.BACKENDS
    assert options.ISSUE_ORDERS is vocabulary.ISSUE_ORDERS
    assert schema.TIERS is run.TIERS is vocabulary.OBSERVED_TIERS
    assert schema.KINDS is vocabulary.EVENT_KINDS and schema.STREAMS is vocabulary.STREAMS
    assert profile.BANDWIDTH_TIERS is vocabulary.BANDWIDTH_TIERS
    assert profile.COMPUTE_MODES is vocabulary.COMPUTE_MODES
    assert calibrate.TIERS is vocabulary.CALIBRATION_TIERS
    assert recommend.RESIDENCY_PATTERNS is vocabulary.RESIDENCIES
    # the search order differs on purpose (the likeliest winners first); the names do not
    assert sorted(recommend.SEARCH_ORDERS) == sorted(vocabulary.ORDERS)
    # the figures colour every tier a run may hold, and only those, in the canonical order
    assert tuple(TIER_COLORS) == vocabulary.OBSERVED_TIERS


def test_the_bottom_modules_import_nothing_above_them():
    import ast

    for module, allowed in ((vocabulary, set()), (checks, {"offload_lab.errors"})):
        tree = ast.parse(inspect.getsource(module))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert {m for m in imported if m.startswith("offload_lab")} <= allowed, module.__name__
