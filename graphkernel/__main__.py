"""``python -m graphkernel``: the ``graphkernel`` command."""

import sys

from graphkernel.cli import run

sys.exit(run())
