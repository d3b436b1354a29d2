"""``python -m gpu_dedup`` = the ``gpu-dedup`` command."""

import sys

from .cli import main

sys.exit(main())
