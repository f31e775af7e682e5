"""A kill matrix's record, one JSON row per run: the verdict, the FAILed cells, each correctness cell (result, prompts beyond / below
the A/A envelope, p), GSM8K (the gate's filter) of both arms, wall and parity time, session blocks — and where the
token divergence came from: the prompts beyond the A/A envelope of ``token_divergence``, split into the short parity
prompts (the first ``[parity] n``) and the long ones (``long_n``).

    PYTHONPATH=. .venv/bin/python scripts/kill_matrix_split.py OUT [--since YYYYMMDD-HHMMSS]

``OUT``: a ``dsa-bench calibrate --defects`` results root (one run directory per defect and A/A run); ``--since``
keeps the run directories named from that time on (a root several invocations wrote into). The rows are what
``results/defects/kill-matrix-*.json`` ``rows`` hold.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.judge import divergence
from harness.run import scoring


def split(run: Path, short_n: int) -> dict | None:
    """``{"beyond", "short", "long"}``: the prompts beyond the A/A envelope of ``token_divergence`` and how many of
    them are among the first ``short_n`` (short) or after (long); None without the scorings."""
    reference, candidate = scoring.load(run, "baseline"), scoring.load(run, "candidate")
    aa = [rows for rows in (scoring.load(run, "baseline-2"), scoring.load(run, "baseline-one")) if rows]
    if not reference or not candidate or not aa:
        return None
    ab, envelope = divergence.token_values(reference, candidate, aa)
    beyond = [i for i in ab if ab[i] > envelope[i] + divergence.TOKEN_TOLERANCE]
    return {"beyond": len(beyond), "short": sum(i < short_n for i in beyond),
            "long": sum(i >= short_n for i in beyond)}


def row(run: Path) -> dict | None:
    """One run directory's record row (module docstring); None before its verdict is written."""
    if not (run / "verdict.json").is_file():
        return None
    manifest = json.loads((run / "manifest.json").read_text())
    verdict = json.loads((run / "verdict.json").read_text())
    accuracy = next((c for c in verdict["cells"] if c["metric"] == "gsm8k_accuracy"), None)
    budget = manifest.get("budget") or {}
    return {"run": run.name, "inject": manifest["scenario"]["arms"].get("candidate", {}).get("inject") or "A/A",
            "overall": verdict["overall"],
            "failed": sorted({c["metric"] for c in verdict["cells"] if c["result"] == "FAIL"}
                             | {c["name"] for c in verdict.get("correctness") or [] if c["result"] == "FAIL"}),
            "correctness": {c["name"]: {"result": c["result"], "exceed": c.get("exceed"), "below": c.get("below"),
                                        "p_fail": c.get("p_fail")} for c in verdict.get("correctness") or []},
            "gsm8k_pct": None if accuracy is None else [accuracy["baseline"], accuracy["candidate"]],
            "gsm8k_filter": verdict["policy_fields"].get("gsm8k_filter"),
            "wall_s": manifest["timing"].get("wall_s"), "parity_s": manifest["timing"].get("parity_s"),
            "blocks": budget.get("blocks"),
            "token_divergence_split": split(run, manifest["scenario"]["parity"]["n"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="a dsa-bench calibrate --defects results root")
    ap.add_argument("--since", default="", help="keep run directories named from this YYYYMMDD-HHMMSS on")
    args = ap.parse_args()
    for run in sorted(p for p in args.out.iterdir() if (p / "manifest.json").is_file() and p.name >= args.since):
        found = row(run)
        if found:
            print(json.dumps(found))


if __name__ == "__main__":
    main()
