"""The correctness cells' A/A false-FAIL rate (and their verdicts on recorded A/B pairs) on recorded scorings and
greedy outputs.

    python -m harness.study.divergence_simulation [--recording tests/fixtures/recorded/scoring-aa] [--resamples 2000]
        [--reference SCORINGS.json [--sizes 32,64]]

The recording (``tests/fixtures/recorded/record_scoring.py``) holds real ``vllm serve`` sessions of the default:
``baseline-1..3``, ``candidate-1..2`` and ``candidate-rope``, each with its parity outputs and its scoring of the same
forced sequences, all prompts at once (``all``) and one at a time (``one``). An **A/A run** is a choice of three
sessions of one arm: the reference ``R``, the stand-in candidate ``C`` and the second session ``S``; the envelope is
``R`` against ``S`` and ``R`` against its own ``one`` batch (the runner's design). Every ordered choice of the
baseline's three sessions, and the candidate arm's two sessions with ``R``'s ``one`` scoring as the only envelope, are
A/A runs. Each is resampled ``resamples`` times over prompts (with replacement; the prompt is the unit of
replication), and every resample judged by :func:`harness.judge.correctness_cell.status_of` (the ``confidence_loss`` cell
by :func:`harness.judge.divergence.confidence_status`).

**Catalogue defects** (``--reference``, :func:`reference_power`): the reference model's teacher-forced scorings of
the correct path's greedy tokens under each defect (``python -m dsa_route.tiny.arith.sensitivity --scorings-out``),
resampled to ``--sizes`` prompts; per defect and size the share of runs each scoring cell (``token_divergence``,
``confidence_loss``) FAILs, the correct path as the reference and as a bit-exact A/A. Harmful defects: power;
harmless ones: their false-FAIL rate.

**Harmless changes** (:func:`harmless_rates`): the recorded compile-off candidate is a fixed numerical difference,
so its A/B values are resampled over prompts the same way, in both directions (the candidate against the baseline,
and the baseline against the candidate as if the arms were swapped), each judged against the bit-exact A/A of its
reference. The rate is how often that harmless change FAILs a run.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from harness.judge import correctness_cell, decode_divergence, divergence
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
    confidence_aa = [sessions[second]["scores"]["all"]] if second else [ref["scores"]["one"]]  # judge()'s order
    aa_parity = [ref["parity"]["one"]] + ([sessions[second]["parity"]["all"]] if second else [])
    out = {}
    for name, values in (("token_divergence", divergence.token_values(ref["scores"]["all"],
                                                                      sessions[candidate]["scores"]["all"],
                                                                      aa_scores)),
                         ("confidence_loss", divergence.confidence_values(ref["scores"]["all"],
                                                                          sessions[candidate]["scores"]["all"],
                                                                          confidence_aa)),
                         ("decode_divergence", decode_divergence.decode_values(*_labelled(sessions, reference,
                                                                                          candidate, second))),
                         ("parity", divergence.parity_values(ref["parity"]["all"],
                                                             sessions[candidate]["parity"]["all"], aa_parity))):
        ab, envelope = values
        keys = sorted(ab)
        out[name] = (np.array([ab[i] for i in keys]), np.array([envelope[i] for i in keys]))
    return out


COUNTS: dict[str, Callable] = {
    "token_divergence": lambda ab, envelope: correctness_cell.envelope_counts(ab, envelope, divergence.TOKEN_TOLERANCE),
    "confidence_loss": None,
    "decode_divergence": lambda ab, envelope: correctness_cell.envelope_counts(ab, envelope,
                                                                               decode_divergence.DECODE_TOLERANCE),
    "parity": divergence.parity_counts}
"""Per cell how its per-prompt values become (exceed, below, unstable) counts for the sign test; None: the cell has
its own test (:func:`cell_status`)."""


def cell_status(cell: str, ab: np.ndarray, envelope: np.ndarray, alpha: float) -> Status:
    """The verdict of one cell on paired per-prompt values, at the default bands."""
    if cell == "confidence_loss":
        return divergence.confidence_status(ab, envelope, alpha)[0]
    return correctness_cell.status_of(*COUNTS[cell](ab, envelope), alpha)


def resampled_fail_rate(values: tuple[np.ndarray, np.ndarray], cell: str, alpha: float, resamples: int,
                        rng: np.random.Generator) -> tuple[int, int]:
    """(FAILs, INVALIDs) over ``resamples`` prompt resamples of one pair's per-prompt values."""
    ab, envelope = values
    fails = invalid = 0
    for _ in range(resamples):
        pick = rng.integers(0, ab.size, ab.size)
        status = cell_status(cell, ab[pick], envelope[pick], alpha)
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
        ab[name] = {cell: str(cell_status(cell, *values[cell], alpha)) for cell in COUNTS}
    rates = {cell: {"false_fail_rate": f / n, "invalid_rate": i / n, "judged": n} for cell, (f, i, n) in totals.items()}
    return {"alpha": alpha, "cell_alpha": alpha / len(correctness_cell.CELLS), "aa": rates, "runs": runs, "ab": ab,
            "harmless": harmless_rates(sessions, alpha, resamples, rng)}


def harmless_rates(sessions: dict[str, dict[str, Any]], alpha: float, resamples: int, rng: np.random.Generator
                   ) -> dict[str, dict[str, Any]]:
    """Per cell that judges scorings, the FAIL rate of the recorded harmless change (every compile-off candidate
    session against every baseline session, and each reversed) over ``resamples`` prompt resamples; the A/A is the
    reference's own one-at-a-time scoring (bit-exact here). ``mean_range``: the smallest and largest per-pair mean
    of the A/B per-prompt values (nats / token; for ``confidence_loss`` signed, so the two directions show)."""
    baselines = sorted(s for s in sessions if s.startswith("baseline-"))
    candidates = sorted(s for s in sessions if s.startswith("candidate-") and sessions[s].get("inject") is None)
    out: dict[str, dict[str, Any]] = {}
    for cell in ("token_divergence", "confidence_loss"):
        fails = judged = 0
        means = []
        for b, c in itertools.product(baselines, candidates):
            for reference, candidate in ((b, c), (c, b)):
                rows = sessions[reference]["scores"]
                values = (divergence.token_values if cell == "token_divergence" else divergence.confidence_values)(
                    rows["all"], sessions[candidate]["scores"]["all"], [rows["one"]])
                keys = sorted(values[0])
                pair = (np.array([values[0][i] for i in keys]), np.array([values[1][i] for i in keys]))
                means.append(float(pair[0].mean()))
                fails += resampled_fail_rate(pair, cell, alpha, resamples, rng)[0]
                judged += resamples
        out[cell] = {"false_fail_rate": fails / judged, "judged": judged,
                     "pairs": 2 * len(baselines) * len(candidates), "mean_range": [min(means), max(means)]}
    return out


def reference_power(path: Path, alpha: float = 0.05, resamples: int = 1000, sizes: tuple[int, ...] = (32, 64),
                    seed: int = 0) -> dict[str, Any]:
    """Per catalogue defect in a ``sensitivity --scorings-out`` file: the per-prompt values' summary (token
    divergence median; confidence shift mean and the prompts that lose / gain) and, per prompt count in ``sizes``,
    the share of ``resamples`` prompt resamples (with replacement) that each scoring cell FAILs."""
    from harness.judge import confidence
    from dsa_route.inject import DEFECTS

    data = json.loads(Path(path).read_text())
    rng = np.random.default_rng(seed)
    correct = data["correct"]
    zero = {int(row["index"]): 0.0 for row in correct}
    out: dict[str, Any] = {"checkpoint": data.get("checkpoint"), "n": len(correct), "seed": data.get("seed"),
                           "distractors": data.get("distractors"), "alpha": alpha, "resamples": resamples,
                           "sizes": list(sizes), "defects": {}}
    for kind in (k for k in DEFECTS if k in data):
        token = divergence.token_values(correct, data[kind], [correct])[0]
        shift = confidence.prompt_shifts(correct, data[kind])
        keys = sorted(token)
        values = {"token_divergence": (np.array([token[i] for i in keys]), np.zeros(len(keys))),
                  "confidence_loss": (np.array([shift[i] for i in keys]), np.array([zero[i] for i in keys]))}
        shifts = values["confidence_loss"][0]
        entry: dict[str, Any] = {
            "harmful": DEFECTS[kind].harmful,
            "token_divergence_median": float(np.median(values["token_divergence"][0])),
            "token_divergence_above_band": int((values["token_divergence"][0] > divergence.TOKEN_TOLERANCE).sum()),
            "confidence_shift_mean": float(shifts.mean()), "confidence_shift_sd": float(shifts.std()),
            "prompts_losing": int((shifts < 0).sum()), "prompts_gaining": int((shifts > 0).sum()),
            "verdict_all": {cell: str(cell_status(cell, *pair, alpha)) for cell, pair in values.items()},
            "fail_rate": {}}
        for size in sizes:
            entry["fail_rate"][str(size)] = {}
            for cell, (ab, envelope) in values.items():
                fails = 0
                for _ in range(resamples):
                    pick = rng.integers(0, ab.size, size)
                    fails += cell_status(cell, ab[pick], envelope[pick], alpha) == Status.FAIL
                entry["fail_rate"][str(size)][cell] = fails / resamples
        out["defects"][kind] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recording", type=Path, default=RECORDING)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--reference", type=Path, default=None,
                        help="a dsa_route.tiny.arith.sensitivity --scorings-out file: per defect, each scoring "
                             "cell's FAIL rate over prompt resamples")
    parser.add_argument("--sizes", default="32,64", help="prompt counts for --reference (default %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="write the --reference result as JSON here")
    args = parser.parse_args(argv)
    if args.reference is not None:
        try:
            sizes = tuple(int(v) for v in args.sizes.split(","))
        except ValueError:
            parser.error(f"--sizes: comma-separated prompt counts, got {args.sizes!r}")
        if not args.reference.is_file() or min(sizes) < 1:
            parser.error(f"--reference {args.reference}: no such file, or a size < 1")
        power = reference_power(args.reference, args.alpha, args.resamples, sizes)
        for kind, entry in power["defects"].items():
            rates = "; ".join(f"n={n}: " + ", ".join(f"{c} {r:.2f}" for c, r in cells.items())
                              for n, cells in entry["fail_rate"].items())
            print(f"{kind:24s} {'harmful' if entry['harmful'] else 'harmless':8s} shift mean "
                  f"{entry['confidence_shift_mean']:+.4f} lose/gain {entry['prompts_losing']}/"
                  f"{entry['prompts_gaining']}  FAIL rate {rates}")
        if args.out:
            args.out.write_text(json.dumps(power, indent=1) + "\n")
        return 0
    result = simulate(args.recording, args.alpha, args.resamples)
    for cell, rate in result["aa"].items():
        print(f"{cell}: A/A false-FAIL {rate['false_fail_rate']:.4f} (INVALID {rate['invalid_rate']:.4f}) over "
              f"{rate['judged']} resampled A/A runs; cell α = {result['cell_alpha']:g}")
    for name, cells in result["ab"].items():
        print(f"baseline-1 vs {name}: " + ", ".join(f"{c} {s}" for c, s in cells.items()))
    for cell, rate in result["harmless"].items():
        print(f"{cell}: harmless compile-off change (both directions) FAIL {rate['false_fail_rate']:.4f} over "
              f"{rate['judged']} resampled runs of {rate['pairs']} session pairs; per-pair mean "
              f"{rate['mean_range'][0]:+.5f} … {rate['mean_range'][1]:+.5f} nats/token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
