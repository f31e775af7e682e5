"""Helpers the shared real runs (tests/conftest.py) and their tests import: a module of its own, since
``from conftest import`` can resolve to tests/dsa/conftest.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

STEP_DELAY_MS = 50   # the slowed candidate's sleep per engine step (dsa_route.inject step-delay)


def second_venv(root: Path) -> Path:
    """A ``python -m venv`` whose site-packages reach this environment's through a .pth file; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next(root.glob("lib/python*/site-packages"))
    here = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "vllm").is_dir())
    (site / "first-venv.pth").write_text(here + "\n")
    return root / "bin" / "python"
