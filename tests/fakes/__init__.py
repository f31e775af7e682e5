"""Fakes for the fault and security tests (see support.py and fake_vllm.py)."""
