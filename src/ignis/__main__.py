"""``python -m ignis``: the ``ignis`` command line."""

import sys

from .cli import main

sys.exit(main())
