"""Does the arithmetic checkpoint's accuracy depend on the DSA path? ``python -m dsa_route.tiny.arith.sensitivity``.

Runs the test problems through the reference model (:mod:`.evaluate`) once on the correct path and once per
injected defect, and prints, per defect, the accuracy (strict / flexible, points) and its drop against the correct
path, and *parity*: the fraction of problems whose greedy answer is token-for-token the correct path's.

Defects: the catalogue :data:`dsa_route.inject.DEFECTS` (each installed on the whole model by
:func:`dsa_route.dsa.injections.install`, the same hooks the serving path's per-arm ``inject`` setting switches on).
Defects that act on MTP drafts only (``min_spec_tokens`` > 0: greedy answers cannot change) are left out.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator

from dsa_route.dsa import DsaForCausalLM
from dsa_route.dsa.injections import install
from dsa_route.inject import DEFECTS

from .evaluate import TEST_SEED, cli_load, cli_parser, evaluate
from .task import generate

INJECTIONS = tuple(kind for kind, spec in DEFECTS.items() if not spec.min_spec_tokens)  # greedy-visible
MIN_DROP_POINTS, MAX_PARITY = 15.0, 0.5
"""What "sparse attention matters" means for the checkpoint: each defect loses at least this many strict-match
points and keeps fewer than this share of the correct path's answers token for token."""


@contextlib.contextmanager
def injected(model: DsaForCausalLM, kind: str) -> Iterator[None]:
    """Defect ``kind`` (:data:`INJECTIONS`) installed on ``model`` inside the block; the correct path restored on exit.
    Raises ValueError for an unknown kind."""
    install(model, kind)
    try:
        yield
    finally:
        install(model, None)


def run(model: DsaForCausalLM, tok, n: int, seed: int = TEST_SEED, kinds: tuple[str, ...] = INJECTIONS,
        mtp_n: int = 0) -> dict:
    """``{"correct": {accuracy, mtp_acceptance_rate, mtp_n}, "<kind>": {accuracy, drop_points, parity}}`` over ``n``
    test problems (MTP acceptance of the correct path on the first ``mtp_n``)."""
    problems = generate(n, seed)
    base = evaluate(model, tok, problems, mtp_n=mtp_n)
    report: dict = {"n": n, "correct": {"accuracy": base.accuracy, "mtp_acceptance_rate": base.mtp_acceptance_rate,
                                        "mtp_n": base.mtp_n}}
    for kind in kinds:
        with injected(model, kind):
            res = evaluate(model, tok, problems)
        same = sum(a == b for a, b in zip(base.outputs, res.outputs)) / n
        report[kind] = {"accuracy": res.accuracy, "parity": same,
                        "drop_points": {f: round(100 * (base.accuracy[f] - res.accuracy[f]), 1) for f in res.accuracy}}
    return report


def main(argv: list[str] | None = None) -> int:
    ap = cli_parser("python -m dsa_route.tiny.arith.sensitivity", __doc__)
    ap.add_argument("--inject", action="append", choices=INJECTIONS, help="defects to try (default: all)")
    args = ap.parse_args(argv)
    loaded = cli_load(ap, args)
    if loaded is None:
        return 2
    model, tok = loaded
    report = run(model, tok, args.n, args.seed, tuple(args.inject or INJECTIONS), args.mtp_n)
    for kind in ("correct", *(args.inject or INJECTIONS)):
        r = report[kind]
        acc = " ".join(f"{f} {100 * a:5.1f} %" for f, a in r["accuracy"].items())
        extra = "" if kind == "correct" else (f"  drop {r['drop_points']} pts  parity {100 * r['parity']:.1f} %")
        print(f"{kind:24s} {acc}{extra}")
    print(json.dumps(report))
    met = [k for k in (args.inject or INJECTIONS) if sensitive(report[k])]
    print(f"sparse attention matters (drop ≥ {MIN_DROP_POINTS:g} pts strict-match and parity < "
          f"{100 * MAX_PARITY:g} %): {len(met)}/{len(args.inject or INJECTIONS)} defects")
    return 0


def sensitive(defect: dict) -> bool:
    """Whether one defect's entry of :func:`run` meets :data:`MIN_DROP_POINTS` and :data:`MAX_PARITY`."""
    return defect["drop_points"]["strict-match"] >= MIN_DROP_POINTS and defect["parity"] < MAX_PARITY


if __name__ == "__main__":
    sys.exit(main())
