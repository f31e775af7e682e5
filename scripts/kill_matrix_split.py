"""Where a kill matrix's token divergence came from: per run, the prompts beyond the A/A envelope of
``token_divergence``, split into the short parity prompts (the first ``[parity] n``) and the long ones (``long_n``).

    PYTHONPATH=. .venv/bin/python scripts/kill_matrix_split.py OUT

``OUT``: a ``dsa-bench calibrate --defects`` results root (one run directory per defect and A/A run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.judge import divergence
from harness.run import scoring


def split(run: Path) -> dict | None:
    """``{"run", "inject", "beyond", "short", "long"}`` for one run directory; None without the scorings."""
    manifest = json.loads((run / "manifest.json").read_text())
    short_n = manifest["scenario"]["parity"]["n"]
    reference, candidate = scoring.load(run, "baseline"), scoring.load(run, "candidate")
    aa = [rows for rows in (scoring.load(run, "baseline-2"), scoring.load(run, "baseline-one")) if rows]
    if not reference or not candidate or not aa:
        return None
    ab, envelope = divergence.token_values(reference, candidate, aa)
    beyond = [i for i in ab if ab[i] > envelope[i] + divergence.TOKEN_TOLERANCE]
    return {"run": run.name, "inject": manifest["scenario"]["arms"].get("candidate", {}).get("inject") or "A/A",
            "beyond": len(beyond), "short": sum(i < short_n for i in beyond),
            "long": sum(i >= short_n for i in beyond)}


if __name__ == "__main__":
    for run in sorted(p for p in Path(sys.argv[1]).iterdir() if (p / "manifest.json").is_file()):
        row = split(run)
        if row:
            print(json.dumps(row))
