"""Hostile pipeline directories: offload-lab checks ``model_index.json`` itself, before diffusers
sees it, and refuses in one line. Each directory is a copy of the tiny pipeline saved once per
session (``tiny_saved``) with its index or files edited."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import offload_lab
from offload_lab.cli.app import main
from offload_lab.model.pipeline_index import check_pipeline_index, read_model_index

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parent.parent
SHARD_INDEX = "transformer/diffusion_pytorch_model.safetensors.index.json"


def _component(entry):
    return lambda d, info: info.__setitem__("transformer", entry)


def _pipeline(name):
    return lambda d, info: info.__setitem__("_class_name", name)


def _shard(target):
    def edit(d: Path, info: dict) -> None:
        p = d / SHARD_INDEX
        idx = json.loads(p.read_text())
        first = sorted(idx["weight_map"])[0]
        shutil.copy(d / "transformer" / idx["weight_map"][first], d / "x.safetensors")
        idx["weight_map"][first] = target
        p.write_text(json.dumps(idx))
    return edit


def _shard_symlink_out(d: Path, info: dict) -> None:
    shard = sorted((d / "transformer").glob("*.safetensors"))[0]
    outside = d.parent / f"{d.name}-outside.safetensors"
    shutil.move(shard, outside)
    shard.symlink_to(outside)


def _folder_symlink_out(d: Path, info: dict) -> None:
    outside = d.parent / f"{d.name}-outside"
    shutil.move(d / "transformer", outside)
    (d / "transformer").symlink_to(outside, target_is_directory=True)


def _code_in_folder(d: Path, info: dict) -> None:
    (d / "transformer" / "modeling_custom.py").write_text("raise SystemExit('custom code ran')\n")


def _pickled_weights(d: Path, info: dict) -> None:
    """The transformer's weights as torch.save wrote them (a pickle), and no safetensors."""
    import torch
    from safetensors.torch import load_file

    folder = d / "transformer"
    state = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(f))
        f.unlink()
    for f in folder.glob("*.safetensors.index.json"):
        f.unlink()
    torch.save(state, folder / "diffusion_pytorch_model.bin")


def _local_module(d: Path, info: dict) -> None:
    (d / "mycomponent.py").write_text("raise SystemExit('custom code ran')\n")
    info["transformer"] = ["mycomponent", "MyModel"]


def _index_symlink_out(d: Path, info: dict) -> None:
    outside = d.parent / f"{d.name}-index.json"
    outside.write_text(json.dumps(info))
    (d / "model_index.json").unlink()
    (d / "model_index.json").symlink_to(outside)


# id -> (edit, a fragment of the refusal)
VARIANTS = {
    "os-system": (_component(["os", "system"]), "names library 'os'"),
    "subprocess-popen": (_component(["subprocess", "Popen"]), "names library 'subprocess'"),
    "builtins-eval": (_component(["builtins", "eval"]), "names library 'builtins'"),
    "not-installed": (_component(["notalib_xyz", "Model"]), "names library 'notalib_xyz'"),
    "component-utils": (_component(["diffusers", "utils"]), "names class 'utils'"),
    "component-loader": (_component(["diffusers", "__loader__"]), "public class name"),
    "component-list": (_component(["diffusers", ["a", "b"]]), "expected [library, class]"),
    "component-three": (_component(["diffusers", "WanTransformer3DModel", "x"]), "expected [library, class]"),
    "component-kind": (_component(["transformers", "AutoConfig"]), "is not a model, scheduler"),
    "component-missing": (_component(["diffusers", "NoSuchModel"]), "does not export"),
    "pipeline-utils": (_pipeline("utils"), "_class_name 'utils' is not a pipeline class"),
    "pipeline-loader": (_pipeline("__loader__"), "_class_name '__loader__' is not a class name"),
    "pipeline-list": (_pipeline(["pipeline", "MyPipeline"]), "custom pipeline's code is not loaded"),
    "pipeline-kind": (_pipeline("WanTransformer3DModel"), "is not a pipeline class"),
    "pipeline-absent": (lambda d, info: info.pop("_class_name"), "_class_name is None"),
    "code-in-folder": (_code_in_folder, "holds code ('transformer/modeling_custom.py')"),
    "local-module": (_local_module, "names library 'mycomponent'"),
    "pickled-weights": (_pickled_weights, "holds its weights as pickle files only ('transformer/diffusion_pytorch_model.bin')"),
    "shard-parent": (_shard("../x.safetensors"), "names shard '../x.safetensors' outside its directory"),
    "shard-absolute": (_shard("/etc/passwd"), "names shard '/etc/passwd' outside its directory"),
    "shard-symlink": (_shard_symlink_out, "resolves outside the directory"),
    "folder-symlink": (_folder_symlink_out, "component folder 'transformer' resolves outside"),
    "index-symlink": (_index_symlink_out, "model_index.json' links outside its directory"),
}


@pytest.fixture(scope="module")
def hostile(tiny_saved, tmp_path_factory):
    """Every variant, built once: id -> directory."""
    base = tmp_path_factory.mktemp("hostile")
    out = {}
    for name, (edit, _) in VARIANTS.items():
        d = base / name
        shutil.copytree(tiny_saved, d)
        info = json.loads((d / "model_index.json").read_text())
        edit(d, info)
        if not (d / "model_index.json").is_symlink():
            (d / "model_index.json").write_text(json.dumps(info))
        out[name] = d
    return out


def test_the_unedited_copy_is_accepted(tiny_saved):
    idx = check_pipeline_index(tiny_saved)
    assert idx.class_name == "WanPipeline" and idx.pipeline_class().__name__ == "WanPipeline"
    assert sorted(idx.components) == ["scheduler", "transformer", "vae"]
    assert idx.components["transformer"] == ("diffusers", "WanTransformer3DModel")
    assert set(idx.absent) == {"text_encoder", "tokenizer", "transformer_2"}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_python_entry_refuses(hostile, variant):
    with pytest.raises(offload_lab.SpecError) as e:
        offload_lab.spec_of(hostile[variant])
    msg = str(e.value)
    assert VARIANTS[variant][1] in msg and "\n" not in msg, msg
    with pytest.raises(offload_lab.SpecError, match="resolves|outside|names|holds|expected|is not"):
        offload_lab.ModelSpec.from_safetensors(hostile[variant])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cli_refuses_in_one_line(hostile, variant, tmp_path, capsys):
    out = tmp_path / "run.zip"
    rc = main(["profile", "--pipeline", str(hostile[variant]), "--out", str(out), "--backend", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("offload-lab: error: ") and VARIANTS[variant][1] in err, err
    assert not out.exists()


# one of each kind of check, through the installed command's own process
@pytest.mark.parametrize("variant", ["os-system", "pipeline-list", "code-in-folder", "shard-symlink"])
def test_cli_process_exits_2_with_one_line(hostile, variant, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    out = tmp_path / "run.zip"
    p = subprocess.run([sys.executable, "-m", "offload_lab", "profile", "--pipeline", str(hostile[variant]),
                        "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert len(p.stderr.splitlines()) == 1 and VARIANTS[variant][1] in p.stderr, p.stderr
    assert not out.exists()


NO_IMPORT = textwrap.dedent(r'''
    import json, sys
    import offload_lab
    import diffusers  # the library itself may load; nothing the index names may
    dirs = json.loads(sys.argv[1])
    before = set(sys.modules)
    refused = 0
    for d in dirs:
        try:
            offload_lab.spec_of(d)
        except offload_lab.SpecError:
            refused += 1
    print("RESULT " + json.dumps({"refused": refused, "new": sorted(set(sys.modules) - before),
                                  "before": sorted(m for m in before if m in ("subprocess",))}))
''')


def test_nothing_the_index_names_is_imported(hostile):
    names = ["not-installed", "local-module", "subprocess-popen", "os-system", "code-in-folder"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-c", NO_IMPORT, json.dumps([str(hostile[n]) for n in names])],
                       capture_output=True, text=True, env=env, timeout=300, cwd=hostile["local-module"])
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads(line[len("RESULT "):])
    assert res["refused"] == len(names)
    new = set(res["new"])
    assert not {"notalib_xyz", "mycomponent", "modeling_custom"} & new, new
    assert not any(m.startswith(("notalib_xyz.", "mycomponent.")) for m in new)
    if "subprocess" not in res["before"]:
        assert "subprocess" not in new


def test_read_model_index_refuses_what_is_no_index(tmp_path):
    p = tmp_path / "model_index.json"
    p.write_text('{"_class_name": "WanPipeline", "_class_name": "X"}')
    with pytest.raises(offload_lab.SpecError, match="names '_class_name' twice"):
        read_model_index(p)
    p.write_text("[1, 2]")
    with pytest.raises(offload_lab.SpecError, match="holds a list; expected a JSON object"):
        read_model_index(p)
    p.write_text(" " * (2 << 20) + "{}")
    with pytest.raises(offload_lab.SpecError, match="over the cap of 1 MiB"):
        read_model_index(p)
    p.unlink()
    os.mkfifo(p)
    with pytest.raises(offload_lab.SpecError, match="not a regular file"):
        read_model_index(p)


def test_a_diffusers_pipeline_module_library_is_accepted(tiny_saved, tmp_path):
    # older indexes name diffusers' own pipeline module: ["stable_diffusion", "<class>"]
    d = tmp_path / "old"
    shutil.copytree(tiny_saved, d)
    info = json.loads((d / "model_index.json").read_text())
    info["safety_checker"] = ["stable_diffusion", "StableDiffusionSafetyChecker"]
    (d / "model_index.json").write_text(json.dumps(info))
    idx = check_pipeline_index(d)
    assert "safety_checker" in idx.absent  # listed without a folder: passed as None
    info["safety_checker"] = ["stable_diffusion", "StableDiffusionPipelineOutput"]
    (d / "model_index.json").write_text(json.dumps(info))
    with pytest.raises(offload_lab.SpecError, match="is not a model, scheduler"):
        check_pipeline_index(d)


def test_a_supported_library_not_installed_is_named(tiny_saved, tmp_path, monkeypatch):
    d = tmp_path / "te"
    shutil.copytree(tiny_saved, d)
    info = json.loads((d / "model_index.json").read_text())
    info["text_encoder"] = ["transformers", "UMT5EncoderModel"]
    (d / "model_index.json").write_text(json.dumps(info))
    # a None entry in sys.modules is how Python itself marks a package as not importable
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(offload_lab.SpecError, match="needs transformers, which is not installed"):
        offload_lab.spec_of(d)


class _RunsCode:
    """Unpickling this creates a file: what a pickle can do when it is loaded."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_beside_safetensors_is_never_unpickled(tiny_saved, tmp_path):
    import pickle

    d = tmp_path / "both"
    shutil.copytree(tiny_saved, d)
    marker = tmp_path / "unpickled"
    for name in ("transformer/diffusion_pytorch_model.bin", "vae/diffusion_pytorch_model.bin"):
        (d / name).write_bytes(pickle.dumps({"weight": _RunsCode(marker)}))
    pickle.loads((d / "vae/diffusion_pytorch_model.bin").read_bytes())  # the payload does run
    assert marker.exists()
    marker.unlink()
    assert check_pipeline_index(d).class_name == "WanPipeline"  # safetensors are there: accepted
    out = tmp_path / "run.zip"
    assert main(["profile", "--pipeline", str(d), "--steps", "1", "--warmup", "0", "--backend", "cpu",
                 "--out", str(out)]) == 0
    assert out.is_file() and not marker.exists()
