"""Quality: the lm-eval adapter (the offloaded engine as an lm-eval model), the ``specterbench eval`` table and
the shipped offline lm-eval tasks."""

import os

# Nothing downloads at run time; an explicit user setting wins. Set when the package is first imported, before
# lm-eval and ``datasets`` are, since ``datasets`` reads these variables once at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
