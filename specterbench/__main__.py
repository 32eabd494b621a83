"""``python -m specterbench``: the command line."""

import sys

from specterbench.cli import main

sys.exit(main())
