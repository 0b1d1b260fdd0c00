"""compare(): ratios only between runs doing the same work; noisy measured runs flagged."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

import offload_lab
from offload_lab import catalog
from offload_lab.analysis import summary
from offload_lab.analysis.comparison import compare, why_not_comparable
from offload_lab.record.run import Run, display_label
from offload_lab.views import tables
from offload_lab.views.report import report

HOST = offload_lab.HostMemory(available="256GiB")
DATA = Path(__file__).resolve().parent / "data" / "runs"


def _sim(model: str, tier: str = "pinned", tokens=None, label: str | None = None) -> Run:
    spec = catalog.load(model)
    return offload_lab.simulate(offload_lab.plan(spec, tier=tier, host=HOST), "h200", steps=2,
                                tokens=tokens, label=label or f"{model} {tier} {tokens}")


def _measured_like(run: Run, walls: list[float], label: str) -> Run:
    """The frames of ``run`` relabelled as a cuda measurement whose steps took ``walls`` seconds."""
    steps = pd.concat([run.steps.iloc[:1]] * len(walls), ignore_index=True)
    steps["step"] = range(len(walls))
    steps["wall_s"] = walls
    meta = dict(run.meta, backend="cuda", simulated=False, label=label, device_name="NVIDIA H200")
    return Run(run.events, run.layers, steps, run.memory, meta)


def test_ratios_only_within_model_tokens_and_backend():
    a14 = _sim("wan2.1-t2v-14b", "pinned", 1024)
    b14 = _sim("wan2.1-t2v-14b", "pageable", 1024)
    small = _sim("wan2.1-t2v-1.3b", "pinned", 1024)        # another model
    tokens = _sim("wan2.1-t2v-14b", "pinned", 4096)         # another token count
    measured = _measured_like(a14, [a14.step_time] * 3, "cuda 14b")  # another backend
    df = compare([a14, b14, small, tokens, measured])
    assert df["ratio"].iloc[0] == 1.0
    assert df["ratio"].iloc[1] == pytest.approx(b14.step_time / a14.step_time)
    assert df["ratio_to"].iloc[1] == display_label(a14) == df["label"].iloc[0]
    for i, why in ((2, "model wan2.1-t2v-14b vs wan2.1-t2v-1.3b"), (3, "tokens 1024 vs 4096"),
                   (4, "backend simulated vs measured on NVIDIA H200")):
        assert math.isnan(df["ratio"].iloc[i]), i
        assert df["ratio_note"].iloc[i].startswith("no ratio: no other run of the same model, tokens and backend")
        assert why in df["ratio_note"].iloc[i], (i, df["ratio_note"].iloc[i])
    # the text table leaves those ratios blank and says why
    text = tables.comparison_frame([a14, b14, small])
    assert text["ratio"].tolist()[:2] == ["×1.00", offload_lab.views.text.fmt_ratio(b14.step_time / a14.step_time)]
    assert text["ratio"][2] == "" and "model" in text["note"][2]


def test_each_group_has_its_own_reference():
    a, b = _sim("wan2.1-t2v-1.3b", "pinned"), _sim("wan2.1-t2v-1.3b", "pageable")
    c, d = _sim("wan2.1-t2v-14b", "pinned"), _sim("wan2.1-t2v-14b", "pageable")
    df = compare([a, c, b, d])
    assert df["ratio_to"].tolist() == [display_label(r) for r in (a, c, a, c)]
    assert df["ratio"].tolist() == pytest.approx([1.0, 1.0, b.step_time / a.step_time, d.step_time / c.step_time])
    assert (df["ratio_note"] == "").all()


def test_measured_runs_compare_on_the_same_device_only():
    base = _sim("wan2.1-t2v-1.3b")
    ours = _measured_like(base, [0.10, 0.10], "ours")
    theirs = Run(ours.events, ours.layers, ours.steps.assign(wall_s=0.2), ours.memory,
                 dict(ours.meta, backend="observe", label="theirs"))
    cpu = Run(ours.events, ours.layers, ours.steps, ours.memory,
              dict(ours.meta, backend="cpu", device_name="x86_64", label="cpu"))
    df = compare([ours, theirs, cpu])
    assert df["ratio"].iloc[1] == pytest.approx(2.0)  # the observer on the same GPU: comparable
    assert math.isnan(df["ratio"].iloc[2])
    assert "backend measured on NVIDIA H200 vs measured on x86_64" in df["ratio_note"].iloc[2]
    # GPU check runs keep their token count under their own settings
    other = Run(ours.events, ours.layers, ours.steps, ours.memory,
                dict(ours.meta, label="1k", gpu_check={"tokens": 1024}))
    mine = Run(ours.events, ours.layers, ours.steps, ours.memory, dict(ours.meta, gpu_check={"tokens": 32760}))
    assert why_not_comparable(mine, other) == "tokens 32760 vs 1024"


def test_a_scaled_model_is_another_model():
    full = _sim("wan2.1-t2v-1.3b")
    scaled = Run(full.events, full.layers, full.steps, full.memory,
                 dict(full.meta, model_bytes=full.meta["model_bytes"] // 20))
    assert "model size" in why_not_comparable(full, scaled)
    assert why_not_comparable(full, full) is None


def test_noisy_run_flagged_in_metrics_compare_and_report():
    base = _sim("wan2.1-t2v-1.3b")
    steady = _measured_like(base, [0.100, 0.104, 0.110], "steady")
    noisy = _measured_like(base, [0.023, 0.287, 2.02], "busy machine")
    edge = _measured_like(base, [0.100, 0.150], "exactly 1.5x")
    assert summary.step_spread(noisy) == pytest.approx(2.02 / 0.023)
    m = summary.metrics(noisy)
    assert m["noisy"] is True and m["spread"] == pytest.approx(2.02 / 0.023)
    assert summary.metrics(steady)["noisy"] is False
    assert summary.is_noisy(edge) is False  # the rule is "more than 1.5x"
    assert summary.is_noisy(_measured_like(base, [0.100, 0.151], "just over")) is True
    # a simulation is never called noisy, however its steps differ
    sim = Run(base.events, base.layers, noisy.steps, base.memory, base.meta)
    assert sim.simulated and summary.is_noisy(sim) is False
    df = compare([steady, noisy])
    assert df["noisy"].tolist() == [False, True]
    note = tables.noise_note(noisy)
    assert note.startswith("noisy: run 'busy machine' took 23 ms to 2.02 s per step") and "1.5×" in note
    assert tables.noise_note(steady) is None
    assert "noisy: slowest step 87.8× the fastest" in tables.comparison_frame([steady, noisy])["note"][1]
    rep = report([steady, noisy])
    assert note in rep.warnings
    text = rep.to_html()
    assert text.count("noisy: run &#39;busy machine&#39; took 23 ms to 2.02 s per step") >= 2  # summary, section
    with pytest.raises(summary.AnalysisError, match="noise limit = 1; accepted: a ratio above 1"):
        summary.is_noisy(noisy, limit=1)


def test_shipped_runs_noise_is_what_their_steps_say():
    # the cpu run shipped for tests was measured on a busy machine; its own step times say so
    run = Run.load(DATA / "pinned-p1.run.zip")
    wall = run.steps["wall_s"]
    assert summary.is_noisy(run) == bool(wall.max() > 1.5 * wall.min())
    assert summary.metrics(run)["spread"] == pytest.approx(wall.max() / wall.min())
