"""Running a comparison: scenario → plan → servers → load, parity, GSM8K → a run directory on disk."""
