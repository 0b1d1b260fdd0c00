"""The simulator's errors: bad input to :func:`simulate`, and impossible device profiles."""

from offload_lab.errors import OffloadLabError


class SimError(OffloadLabError, ValueError):
    """Input the simulator cannot use: a plan that does not fit the spec, a bad step count, ..."""


class ProfileError(SimError):
    """A device profile that is incomplete or impossible (missing tier, bandwidth <= 0, ...)."""

