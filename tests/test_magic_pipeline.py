"""``%offload_profile`` on a diffusers pipeline call, in its own IPython process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("IPython")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")

SCRIPT = textwrap.dedent(r'''
    import json
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    ip = start_ipython()
    ip.run_line_magic("load_ext", "offload_lab")
    ip.run_cell("""
    import torch
    from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_pipeline, tiny_wan_call
    pipe = tiny_wan_pipeline(layers=3)
    with torch.no_grad():
        ref = pipe(**tiny_wan_call(steps=2)).frames
    outs = []
    """)
    with capture_output() as c:
        r = ip.run_cell("run = %offload_profile --tier pinned -n 1 --warmup 0 --backend cpu -o pipe "
                        "outs.append(pipe(**tiny_wan_call(steps=2)).frames)")
    res = {"success": r.success, "html": [o.data.get("text/html", "") for o in c.outputs]}
    if r.success:
        res.update(ip.ev("""dict(steps=len(run.steps), calls=run.steps['calls'].tolist(),
                                 steps_from=run.meta['steps_from'], pipeline=run.meta.get('pipeline'),
                                 same=bool(torch.equal(outs[0], ref)),
                                 restored='step' not in vars(pipe.scheduler),
                                 groups=sorted(set(run.layers['group'])))"""))
    # a component of the pipeline, the statement a whole request: the scheduler's steps
    with capture_output() as c:
        r = ip.run_cell("run2 = %offload_profile --tier pinned -n 1 --warmup 1 --backend cpu -o "
                        "pipe.transformer outs.append(pipe(**tiny_wan_call(steps=2)).frames)")
    res["component_success"] = r.success
    if r.success:
        res.update(ip.ev("""dict(c_steps=len(run2.steps), c_calls=run2.steps['calls'].tolist(),
                                 c_from=run2.meta['steps_from'], c_same=bool(torch.equal(outs[-1], ref)),
                                 c_warm=run2.meta['warmup_dropped'])"""))
    print("RESULT " + json.dumps(res))
''')


def test_magic_profiles_a_pipeline_call():
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads(line[len("RESULT "):])
    assert res["success"], res
    # 2 denoising steps of 2 transformer calls, then the VAE's decode in a step of its own
    assert res["steps"] == 3 and res["calls"][:2] == [2, 2]
    assert res["steps_from"] == "scheduler" and res["pipeline"] == "WanPipeline"
    assert res["same"] and res["restored"]
    assert "transformer.blocks" in res["groups"]
    assert any("Timeline" in h for h in res["html"])
    # the transformer alone over a whole request: 2 steps of 2 calls, as offload(pipe.transformer)
    # finds them (not one step per request); the warm-up request's steps dropped
    assert res["component_success"], res
    assert res["c_steps"] == 2 and res["c_calls"] == [2, 2] and res["c_from"] == "scheduler"
    assert res["c_same"] and res["c_warm"] == 2
