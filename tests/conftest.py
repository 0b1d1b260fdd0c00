"""Test-wide settings.

OpenMP threads that spin-wait for a core held by another thread (the cpu backend's copy
engine, or another process) make CPU timings swing tenfold; waiting passively keeps them
steady. It must be set before torch starts its thread pool, hence here.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
