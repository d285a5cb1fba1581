"""``python -m fusion_tvm``: the same command line as ``fusion-tvm``."""

import sys

from .cli import main

sys.exit(main())
