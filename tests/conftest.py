"""Test-wide settings.

OpenMP threads that spin-wait for a core held by another thread (the cpu backend's copy
engine, or another process) make CPU timings swing tenfold; waiting passively keeps them
steady. It must be set before torch starts its thread pool, hence here.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


import pytest  # noqa: E402

XSS = "</script><script>alert(1)</script>"


@pytest.fixture(scope="session")
def measured():
    """cpu-backend runs of a tiny Wan-shaped model; the pageable one has a hostile label."""
    import offload_lab
    from offload_lab import catalog, synthetic

    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=3)
    inputs = synthetic.example_inputs(model, tokens=32)
    spec = offload_lab.spec_of(model)
    host = offload_lab.HostMemory(available="256GiB")
    runs = []
    for tier, label in (("pinned", "pinned"), ("pageable", XSS)):
        plan = offload_lab.plan(spec, tier=tier, host=host)
        runs.append(offload_lab.profile(model, lambda: model(**inputs), plan, steps=2, warmup=1,
                                        backend="cpu", label=label))
    return runs
