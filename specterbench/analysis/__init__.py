"""Analysis of results: the summary table (report), plots, comparison of two runs (compare) and the CI gate."""
