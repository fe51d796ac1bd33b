"""``python -m cute_kernels``: the ``cute-kernels`` command (:mod:`cute_kernels.tools.cli`)."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
