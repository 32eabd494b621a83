"""The suite's folders mirror the package's layers (docs/architecture.md); helpers shared by several folders live
beside this file."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cli_errors, for every folder's bad-input tests
