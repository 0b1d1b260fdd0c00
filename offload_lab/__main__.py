"""``python -m offload_lab`` runs the ``offload-lab`` command (see :mod:`offload_lab.cli`)."""

import sys

from offload_lab.cli import main

if __name__ == "__main__":
    sys.exit(main())
