"""The correctness cells' A/A false-FAIL rate (and their verdicts on recorded A/B pairs) on recorded scorings and
greedy outputs.

    python -m harness.study.divergence_simulation [--recording tests/fixtures/recorded/scoring-aa] [--resamples 2000]

The recording (``tests/fixtures/recorded/record_scoring.py``) holds real ``vllm serve`` sessions of the default:
``baseline-1..3``, ``candidate-1..2`` and ``candidate-rope``, each with its parity outputs and its scoring of the same
forced sequences, all prompts at once (``all``) and one at a time (``one``). An **A/A run** is a choice of three
sessions of one arm: the reference ``R``, the stand-in candidate ``C`` and the second session ``S``; the envelope is
``R`` against ``S`` and ``R`` against its own ``one`` batch (the runner's design). Every ordered choice of the
baseline's three sessions, and the candidate arm's two sessions with ``R``'s ``one`` scoring as the only envelope, are
A/A runs. Each is resampled ``resamples`` times over prompts (with replacement; the prompt is the unit of
replication), and every resample judged by :func:`harness.judge.divergence.status_of`.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from harness.judge import divergence
from harness.rundir.schema import Status

RECORDING = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "recorded" / "scoring-aa"


def load(recording: Path = RECORDING) -> dict[str, dict[str, Any]]:
    """``{session: record}`` of every ``*.json`` in the recording."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(recording.glob("*.json"))}


def aa_triples(sessions: dict[str, dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    """(reference, stand-in candidate, second session or None) of every A/A run the recording holds."""
    baselines = sorted(s for s in sessions if s.startswith("baseline-"))
    candidates = sorted(s for s in sessions if s.startswith("candidate-") and sessions[s].get("inject") is None)
    triples: list[tuple[str, str, str | None]] = list(itertools.permutations(baselines, 3))
    triples += [(r, c, None) for r, c in itertools.permutations(candidates, 2)]
    return triples


def _labelled(sessions: dict[str, dict[str, Any]], reference: str, candidate: str, second: str | None
              ) -> tuple[dict[str, list], dict[str, list]]:
    """(scorings, greedy outputs) keyed by the run's labels (:data:`harness.judge.divergence.SCORINGS`), as the
    runner would have written them for this A/A run."""
    sources = {"baseline": (reference, "all"), "baseline-one": (reference, "one"), "candidate": (candidate, "all"),
               **({"baseline-2": (second, "all")} if second else {})}
    return ({label: sessions[s]["scores"][batch] for label, (s, batch) in sources.items()},
            {label: sessions[s]["parity"][batch] for label, (s, batch) in sources.items()})


def pair_values(sessions: dict[str, dict[str, Any]], reference: str, candidate: str, second: str | None
                ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per cell the per-prompt (A/B, envelope) arrays, prompts in index order."""
    ref = sessions[reference]
    aa_scores = [ref["scores"]["one"]] + ([sessions[second]["scores"]["all"]] if second else [])
    aa_parity = [ref["parity"]["one"]] + ([sessions[second]["parity"]["all"]] if second else [])
    out = {}
    for name, values in (("token_divergence", divergence.token_values(ref["scores"]["all"],
                                                                      sessions[candidate]["scores"]["all"],
                                                                      aa_scores)),
                         ("decode_divergence", divergence.decode_values(*_labelled(sessions, reference, candidate,
                                                                                   second))),
                         ("parity", divergence.parity_values(ref["parity"]["all"],
                                                             sessions[candidate]["parity"]["all"], aa_parity))):
        ab, envelope = values
        keys = sorted(ab)
        out[name] = (np.array([ab[i] for i in keys]), np.array([envelope[i] for i in keys]))
    return out


COUNTS: dict[str, Callable] = {
    "token_divergence": divergence.token_counts,
    "decode_divergence": lambda ab, envelope: divergence.token_counts(ab, envelope, divergence.DECODE_TOLERANCE),
    "parity": divergence.parity_counts}


def resampled_fail_rate(values: tuple[np.ndarray, np.ndarray], cell: str, alpha: float, resamples: int,
                        rng: np.random.Generator) -> tuple[int, int]:
    """(FAILs, INVALIDs) over ``resamples`` prompt resamples of one pair's per-prompt values."""
    ab, envelope = values
    fails = invalid = 0
    for _ in range(resamples):
        pick = rng.integers(0, ab.size, ab.size)
        status = divergence.status_of(*COUNTS[cell](ab[pick], envelope[pick]), alpha)
        fails += status == Status.FAIL
        invalid += status == Status.INVALID
    return fails, invalid


def simulate(recording: Path = RECORDING, alpha: float = 0.05, resamples: int = 2000, seed: int = 0
             ) -> dict[str, Any]:
    """A/A false-FAIL (and INVALID) rates per cell over every A/A run × resample, with the per-run figures; and the
    unresampled verdicts of the recorded A/B pairs (baseline-1 against each candidate session)."""
    sessions = load(recording)
    rng = np.random.default_rng(seed)
    runs, totals = [], {cell: [0, 0, 0] for cell in COUNTS}
    for triple in aa_triples(sessions):
        values = pair_values(sessions, *triple)
        entry = {"reference": triple[0], "candidate": triple[1], "second": triple[2]}
        for cell in COUNTS:
            fails, invalid = resampled_fail_rate(values[cell], cell, alpha, resamples, rng)
            entry[cell] = {"fails": fails, "invalid": invalid, "resamples": resamples}
            totals[cell][0] += fails
            totals[cell][1] += invalid
            totals[cell][2] += resamples
        runs.append(entry)
    ab = {}
    for name in sorted(s for s in sessions if s.startswith("candidate-")):
        values = pair_values(sessions, "baseline-1", name, "baseline-2")
        ab[name] = {cell: str(divergence.status_of(*COUNTS[cell](*values[cell]), alpha)) for cell in COUNTS}
    rates = {cell: {"false_fail_rate": f / n, "invalid_rate": i / n, "judged": n} for cell, (f, i, n) in totals.items()}
    return {"alpha": alpha, "cell_alpha": alpha / len(divergence.CELLS), "aa": rates, "runs": runs, "ab": ab}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recording", type=Path, default=RECORDING)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--alpha", type=float, default=0.05)
    args = parser.parse_args(argv)
    result = simulate(args.recording, args.alpha, args.resamples)
    for cell, rate in result["aa"].items():
        print(f"{cell}: A/A false-FAIL {rate['false_fail_rate']:.4f} (INVALID {rate['invalid_rate']:.4f}) over "
              f"{rate['judged']} resampled A/A runs; cell α = {result['cell_alpha']:g}")
    for name, cells in result["ab"].items():
        print(f"baseline-1 vs {name}: " + ", ".join(f"{c} {s}" for c, s in cells.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
