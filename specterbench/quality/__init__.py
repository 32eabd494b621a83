"""Quality: the lm-eval adapter (the offloaded engine as an lm-eval model), the `specterbench eval` table and
the shipped offline lm-eval tasks."""
