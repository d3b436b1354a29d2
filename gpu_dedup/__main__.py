"""``python -m gpu_dedup`` = the ``gpu-dedup`` command."""

import sys

from gpu_dedup.cli import main

sys.exit(main())
