"""Tiny seeded checkpoints for CPU runs and tests: DeepSeek-V3 (``v3``) and DeepSeek-V3.2 DSA (``v32``)."""
