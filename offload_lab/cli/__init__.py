"""The ``offload-lab`` command: ``demo | plan | profile | simulate | report | catalog``."""

from offload_lab.cli.app import main

__all__ = ["main"]
