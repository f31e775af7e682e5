"""Tiny DSA models the project builds itself for CPU runs (generated known-answer checkpoints, and models trained
in-repo on a checkable task)."""
