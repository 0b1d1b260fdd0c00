"""Predicting a plan's timeline without a GPU: device profiles, the event engine, calibration.

``profile`` (:class:`DeviceProfile`, shipped :func:`names`) → ``layers`` (a plan checked and
timed for the engine) → ``engine`` (:func:`simulate`, recording into ``events``); ``runs``
(:func:`plan_of_run`) and ``calibration`` (:func:`calibrate`) read measured runs back;
``heldout`` measures how well a profile predicts runs it was not fitted on.
"""

from offload_lab.simulation.calibration import CPU_PRIOR, calibrate
from offload_lab.simulation.engine import simulate
from offload_lab.simulation.errors import ProfileError, SimError
from offload_lab.simulation.profile import BANDWIDTH_TIERS, DeviceProfile, names
from offload_lab.simulation.runs import plan_of_run

__all__ = ["DeviceProfile", "simulate", "calibrate", "plan_of_run", "names", "SimError", "ProfileError",
           "BANDWIDTH_TIERS", "CPU_PRIOR"]
