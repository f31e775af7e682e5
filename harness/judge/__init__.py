"""Judging a run, pure: policy, statistics, validity checks and the verdict (no files, processes or sockets)."""
