"""``%offload_profile``, exercised in its own process with IPython's testing shell.

One subprocess runs every scenario (an IPython shell per process is a global, and starting
torch and IPython twice would double the cost) and reports each as JSON; the tests read it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("IPython")

SCRIPT = textwrap.dedent(r'''
    import json, sys, traceback
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    ip = start_ipython()
    out = {}

    def cell(code):
        with capture_output() as c:
            r = ip.run_cell(code)
        return {
            "success": r.success,
            "error": type(r.error_in_exec).__name__ if r.error_in_exec is not None else None,
            "stdout": c.stdout, "stderr": c.stderr,
            "mimetypes": [sorted(o.data) for o in c.outputs],
            "html": [o.data.get("text/html", "") for o in c.outputs],
            "plain": [o.data.get("text/plain", "") for o in c.outputs],
        }

    def probe(code):
        """Evaluate an expression in the user namespace; its value as JSON."""
        return ip.ev(code)

    ip.run_line_magic("load_ext", "offload_lab")
    setup = cell("""
    import torch, offload_lab
    from offload_lab import catalog, synthetic
    from offload_lab.record.runtime.manager import ACTIVE
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=3)
    inputs = synthetic.example_inputs(model, tokens=32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    def restored():
        return (all(torch.equal(before[k], v) for k, v in model.state_dict().items())
                and model not in ACTIVE)
    calls = []
    def record(*args, **kw):
        calls.append([list(args), kw])
        return model(**inputs)
    def bad():
        return helper_that_divides()
    def helper_that_divides():
        return 1 / 0
    n = [0]
    def interrupt_on_second_call():
        n[0] += 1
        if n[0] == 2:
            raise KeyboardInterrupt
        return model(**inputs)
    """)
    assert setup["success"], setup
    out["registered"] = {
        "line": "offload_profile" in ip.magics_manager.magics["line"],
        "cell": "offload_profile" in ip.magics_manager.magics["cell"],
    }
    out["help"] = cell("%offload_profile?")
    out["dash_h"] = cell("%offload_profile -h")
    out["dash_h_late"] = cell("%offload_profile -n 2 --help model model(**inputs)")
    out["line"] = cell("%offload_profile -n 2 --backend cpu model model(**inputs)")
    out["returned"] = cell("r = %offload_profile -q -o -n 2 --backend cpu model model(**inputs)")
    out["returned_info"] = probe("[type(r).__name__, len(r.steps), r.backend, r.simulated, "
                                 "sorted(set(r.layers['tier']))]")
    out["options"] = cell("r = %offload_profile -q -o -n 1 --warmup 0 -b 200KiB -p 2 --order reverse "
                          "--resident 1 --residency strided --backend cpu model model(**inputs)")
    out["options_info"] = probe("[r.meta['plan']['pin_budget'], r.meta['plan']['prefetch'], "
                                "r.meta['plan']['order'], r.meta['plan']['resident'], "
                                "r.meta['plan']['residency'], r.meta['warmup_dropped'], len(r.steps)]")
    out["tier"] = cell("r = %offload_profile -q -o -n 1 --tier pageable --backend cpu model model(**inputs)")
    out["tier_info"] = probe("sorted(set(r.layers['tier']))")
    out["compare"] = cell("rs = %offload_profile -o -n 1 --compare pinned,pageable --backend cpu "
                          "model model(**inputs)")
    out["compare_info"] = probe("[[sorted(set(x.layers['tier'])) for x in rs], type(rs).__name__]")
    out["tiers"] = cell("rs = %offload_profile -q -o -n 1 --warmup 0 --tiers pageable,pinned "
                        "--backend cpu model model(**inputs)")
    out["tiers_info"] = probe("[sorted(set(x.layers['tier'])) for x in rs]")
    out["all_budget"] = cell("r = %offload_profile -q -o -n 1 --warmup 0 -b all --backend cpu "
                             "model model(**inputs)")
    out["all_budget_info"] = probe("r.meta['plan']['pin_budget']")
    out["quoted"] = cell("""%offload_profile -q -n 1 --warmup 0 --backend cpu model record("a  b", {"k": [1, 2]}, key='x y')""")
    out["quoted_info"] = probe("calls[-1]")
    out["cell"] = cell("%%offload_profile -q -o -n 2 --warmup 1 --backend cpu model\n"
                       "calls.append('cell')\n"
                       "y = model(**inputs)\n")
    out["cell_info"] = probe("[calls.count('cell'), type(_).__name__ if '_' in dir() else None]")
    out["report"] = cell(f"%offload_profile -q -n 1 --backend cpu --report {sys.argv[1]!r} model model(**inputs)")
    out["user_error"] = cell("%offload_profile -n 2 --backend cpu model bad()")
    out["user_error_restored"] = probe("restored()")
    out["cell_error"] = cell("%%offload_profile -n 2 --backend cpu model\nx = 1\nbad()\n")
    out["interrupt"] = cell("%offload_profile -n 3 --backend cpu model interrupt_on_second_call()")
    out["interrupt_restored"] = probe("restored()")
    out["after_interrupt"] = cell("r = %offload_profile -q -o -n 1 --backend cpu model model(**inputs)")
    out["after_interrupt_restored"] = probe("restored()")
    bad_usage = {
        "steps": "%offload_profile -n 0 model model(**inputs)",
        "unknown_option": "%offload_profile --nope model model(**inputs)",
        "no_statement": "%offload_profile model",
        "no_model": "%offload_profile -n 2",
        "undefined_model": "%offload_profile not_defined_anywhere model(**inputs)",
        "not_a_module": "%offload_profile inputs model(**inputs)",
        "bad_tier": "%offload_profile --tier fast model model(**inputs)",
        "bad_compare": "%offload_profile --compare pinned,fast model model(**inputs)",
        "tier_and_compare": "%offload_profile --tier pinned --compare pinned,pageable model model(**inputs)",
        "mapped_without_views": "%offload_profile --tier mapped model model(**inputs)",
        "bad_budget": "%offload_profile -b lots model model(**inputs)",
        "huge_budget": "%offload_profile -b 1e400 model model(**inputs)",
        "huge_steps": "%offload_profile -n 100000000 model model(**inputs)",
        "bad_tiers": "%offload_profile --tiers pinned,pinned model model(**inputs)",
        "syntax": "%offload_profile model model(**inputs",
        "cell_extra": "%%offload_profile model model(**inputs)\nmodel(**inputs)\n",
    }
    out["usage"] = {k: cell(v) for k, v in bad_usage.items()}
    out["usage_restored"] = probe("restored()")
    print("@@RESULT@@" + json.dumps(out, default=repr))
''')


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("magic")
    script = tmp / "magic_scenarios.py"
    script.write_text(SCRIPT)
    report = tmp / "magic-report.html"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.run([sys.executable, str(script), str(report)], capture_output=True,
                          text=True, timeout=600, cwd=tmp, env=env)
    marker = "@@RESULT@@"
    if marker not in proc.stdout:
        pytest.fail(f"scenario script failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    data = json.loads(proc.stdout.split(marker, 1)[1])
    data["report_path"] = str(report)
    return data


def test_load_ext_registers_a_line_and_cell_magic(results):
    assert results["registered"] == {"line": True, "cell": True}


def test_question_mark_prints_help(results):
    text = results["help"]["stdout"]
    for option in ("--pin-budget", "--prefetch", "--order", "--resident", "--tier", "--steps",
                   "--warmup", "--tiers", "--compare", "--report", "-o", "-q", "MODEL", "STATEMENT"):
        assert option in text, option


@pytest.mark.parametrize("key", ["dash_h", "dash_h_late"])
def test_dash_h_prints_the_same_help_as_question_mark(results, key):
    r = results[key]
    assert r["success"], r
    assert "UsageError" not in r["stdout"] + r["stderr"]
    assert r["stdout"].startswith("usage: %offload_profile [-b SIZE]"), r["stdout"][:80]
    for option in ("--pin-budget", "--tiers", "--compare", "--steps", "MODEL", "STATEMENT"):
        assert option in r["stdout"], option
    assert r["mimetypes"] == []  # nothing was profiled


def test_tiers_option_and_the_all_budget_match_the_cli(results):
    assert results["tiers"]["success"], results["tiers"]
    assert results["tiers_info"] == [["pageable"], ["pinned"]]
    assert results["all_budget"]["success"], results["all_budget"]
    assert results["all_budget_info"] is None


def test_line_magic_displays_html_and_plain(results):
    r = results["line"]
    assert r["success"], r
    assert r["mimetypes"] == [["text/html", "text/plain"]]
    html, plain = r["html"][0], r["plain"][0]
    assert "plotly-graph-div" in html and "<table" in html and "Timeline" in html
    assert "3 pinned" in plain and "step" in plain


def test_o_returns_the_run_and_q_displays_nothing(results):
    r = results["returned"]
    assert r["success"] and r["mimetypes"] == []
    assert results["returned_info"] == ["Run", 2, "cpu", False, ["pinned"]]


def test_options_reach_the_plan_and_the_run(results):
    assert results["options"]["success"], results["options"]
    budget, prefetch, order, resident, residency, warmup, steps = results["options_info"]
    assert (budget, prefetch, order, resident, residency) == (200 * 1024, 2, "reverse", 1, "strided")
    assert (warmup, steps) == (0, 1)
    assert results["tier_info"] == ["pageable"]


def test_compare_makes_one_run_per_tier_and_a_comparison(results):
    r = results["compare"]
    assert r["success"], r
    assert results["compare_info"] == [[["pinned"], ["pageable"]], "list"]
    html = r["html"][0]
    # step-time bars plus one timeline per run
    assert html.count("plotly-graph-div") >= 3
    assert "pageable" in r["plain"][0] and "cpu backend" in r["plain"][0]


def test_statement_reaches_python_untouched(results):
    assert results["quoted"]["success"], results["quoted"]
    assert results["quoted_info"] == [["a  b", {"k": [1, 2]}], {"key": "x y"}]


def test_cell_magic_runs_the_body_once_per_step(results):
    assert results["cell"]["success"], results["cell"]
    assert results["cell_info"][0] == 3  # warm-up + 2 steps


def test_report_option_writes_the_file(results):
    assert results["report"]["success"], results["report"]
    text = Path(results["report_path"]).read_text(encoding="utf-8")
    assert "plotly-graph-div" in text


@pytest.mark.parametrize("key", ["user_error", "cell_error"])
def test_user_errors_show_the_users_traceback(results, key):
    r = results[key]
    assert not r["success"] and r["error"] == "ZeroDivisionError"
    tb = r["stdout"] + r["stderr"]
    assert "helper_that_divides" in tb and "1 / 0" in tb and "bad()" in tb
    assert "offload_lab" not in tb and "run_line_magic" not in tb and "run_cell_magic" not in tb
    assert results["user_error_restored"] is True


def test_ctrl_c_stops_cleanly_and_restores_the_model(results):
    r = results["interrupt"]
    assert not r["success"] and r["error"] == "KeyboardInterrupt"
    text = r["stdout"] + r["stderr"]
    assert "stopped by Ctrl-C during step 2 of 4" in text and "restored" in text
    assert "Traceback" not in text
    assert results["interrupt_restored"] is True
    assert results["after_interrupt"]["success"] and results["after_interrupt_restored"] is True


@pytest.mark.parametrize("key, words", [
    ("steps", ["--steps", "'0'", "1..1000"]),
    ("huge_steps", ["--steps", "'100000000'", "1..1000"]),
    ("huge_budget", ["'1e400'", "too large"]),
    ("bad_tiers", ["twice"]),
    ("unknown_option", ["--nope", "--pin-budget"]),
    ("no_statement", ["STATEMENT is missing"]),
    ("no_model", ["MODEL is missing"]),
    ("undefined_model", ["not_defined_anywhere"]),
    ("not_a_module", ["'inputs'", "dict", "torch.nn.Module"]),
    ("bad_tier", ["fast"]),
    ("bad_compare", ["fast", "pinned, staged, pageable, mapped"]),
    ("tier_and_compare", ["--tier", "--tiers", "--compare"]),
    ("mapped_without_views", ["mapped", "checkpoint view"]),
    ("bad_budget", ["lots"]),
    ("syntax", ["not valid Python"]),
    ("cell_extra", ["cell body"]),
])
def test_bad_usage_is_one_line_that_names_the_value(results, key, words):
    r = results["usage"][key]
    assert not r["success"], r
    text = r["stdout"] + r["stderr"]
    assert "UsageError" in text, text
    assert "Traceback" not in text, text
    for w in words:
        assert w in text, (w, text)
    assert results["usage_restored"] is True
