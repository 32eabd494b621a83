"""The run folder on disk: result rows (``rows.jsonl``, one JSON line per cell, and its schema), the decoded
reference (``reference.jsonl``), the saved options (``run.json``) and the lock that keeps one writer at a time."""
