"""``offload-lab profile --pipeline DIR`` on directories written by the real diffusers writer."""

from __future__ import annotations

import json

import pytest
import torch

import offload_lab
from offload_lab.cli.app import main

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from tiny_pipelines import LAYERS  # noqa: E402


def _refused(capsys, argv, out, match):
    try:
        rc = main(argv)
    except SystemExit as e:  # the option parser refuses a bad value itself
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    assert not out.exists()


def test_not_a_pipeline_directory(tmp_path, capsys):
    out = tmp_path / "run.zip"
    _refused(capsys, ["profile", "--pipeline", str(tmp_path), "--out", str(out)], out, "no model_index.json")
    _refused(capsys, ["profile", "--pipeline", str(tmp_path / "nope"), "--out", str(out)], out, "not a directory")


def test_pipeline_without_layer_groups(tmp_path, capsys):
    from safetensors.torch import save_file

    (tmp_path / "model_index.json").write_text(json.dumps(
        {"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"]}))
    (tmp_path / "transformer").mkdir()
    save_file({"proj.weight": torch.zeros(4, 4), "norm.weight": torch.zeros(4)},
              str(tmp_path / "transformer" / "diffusion_pytorch_model.safetensors"))
    out = tmp_path / "run.zip"
    _refused(capsys, ["profile", "--pipeline", str(tmp_path), "--out", str(out)], out, "has a layer group")


def test_zero_steps_refused(tiny_saved, tmp_path, capsys):
    out = tmp_path / "run.zip"
    _refused(capsys, ["profile", "--pipeline", str(tiny_saved), "--steps", "0", "--out", str(out)], out, "steps")


def test_model_and_pipeline_together_refused(tiny_saved, tmp_path, capsys):
    out = tmp_path / "run.zip"
    _refused(capsys, ["profile", "wan2.1-t2v-1.3b", "--pipeline", str(tiny_saved), "--out", str(out)], out,
             "not both")


def test_profile_pipeline_directory(tiny_saved, tmp_path, capsys):
    out = tmp_path / "run.zip"
    argv = ["profile", "--pipeline", str(tiny_saved), "--steps", "4", "--height", "64", "--width", "64",
            "--frames", "5", "--warmup", "0", "--backend", "cpu", "--tier", "mapped", "--out", str(out)]
    assert main(argv) == 0
    run = offload_lab.Run.load(out)
    assert run.meta["steps_from"] == "scheduler" and run.meta["pipeline"] == "WanPipeline"
    # 4 denoising steps of 2 transformer calls, then the VAE's decode
    assert len(run.steps) == 5 and run.steps["calls"].tolist()[:4] == [2] * 4
    lay = run.layers[run.layers["group"] == "transformer.blocks"]
    assert len(lay) == LAYERS and (lay["tier"] == "mapped").all()
    assert "saved" in capsys.readouterr().out


def test_profile_pipeline_takes_the_single_model_options(tiny_saved, tmp_path, capsys):
    out, rep = tmp_path / "run.zip", tmp_path / "r.html"
    argv = ["profile", "--pipeline", str(tiny_saved), "--steps", "2", "--warmup", "0", "--backend", "cpu",
            "--report", str(rep), "--resident", "2", "--issue", "before-compute", "--order", "reverse",
            "--residency", "strided", "--out", str(out)]
    assert main(argv) == 0
    assert rep.is_file() and rep.read_text().lstrip().lower().startswith("<!doctype html")
    run = offload_lab.Run.load(out)
    assert run.meta["issue"] == "before-compute"
    params = run.meta["plan"]["components"]["transformer"]
    assert params["resident"] == 2 and params["residency"] == "strided" and params["order"] == "reverse"
    lay = run.layers[run.layers["group"] == "transformer.blocks"]
    assert (lay["tier"] == "resident").sum() == 2
    assert "report" in capsys.readouterr().out


def test_profile_pipeline_staging_and_synthetic_sizes(tiny_saved, tmp_path, capsys):
    out = tmp_path / "run.zip"
    assert main(["profile", "--pipeline", str(tiny_saved), "--steps", "1", "--warmup", "0", "--backend", "cpu",
                 "--staging", "--out", str(out)]) == 0
    assert offload_lab.Run.load(out).meta["plan"]["components"]["transformer"]["staging"] is True
    out2 = tmp_path / "run2.zip"
    capsys.readouterr()
    _refused(capsys, ["profile", "--pipeline", str(tiny_saved), "--layers", "2", "--out", str(out2)], out2,
             "--layers size a synthetic model")
