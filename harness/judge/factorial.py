"""Two-level factorial designs: the runs, the terms a model estimates and their aliases. Pure (itertools only).

- Full 2^k (k ≤ 4): every combination of the k factors at two levels, in standard (Yates) order.
- The 2^(4−1) fraction: the full 2^3 over A, B, C with the generator D = ABC, defining relation I = ABCD,
  resolution IV — main effects aliased with three-factor interactions only (A = BCD, B = ACD, C = ABD, D = ABC),
  two-factor interactions in pairs (AB = CD, AC = BD, AD = BC). Sources: Box, Hunter & Hunter, *Statistics for
  Experimenters*, 2nd ed. (2005), ch. 6; Montgomery, *Design and Analysis of Experiments*, §8.2 (the one-half
  fraction of the 2^k design).

Used by :mod:`harness.run.factors` (which arms a scenario's factors generate) and :mod:`harness.judge.attribution`
(which effects the model fits).
"""

from __future__ import annotations

import itertools
from typing import Sequence

__all__ = ["LETTERS", "MAX_FACTORS", "design_rows", "effect_terms", "aliases", "arm_name"]

MAX_FACTORS = 4
LETTERS = "ABCD"


def design_rows(k: int, design: str = "full") -> list[tuple[int, ...]]:
    """The design's runs as 0/1 tuples (1 = on), in standard (Yates) order — the first factor alternates fastest.

    ``design = "half"`` (k = 4): the 2^3 over A, B, C with D = ABC in ±1 coding (D on iff an odd number of A, B, C
    is on; Box, Hunter & Hunter 2005 ch. 6; Montgomery §8.2). Returns 2^k or 2^(k−1) rows.

    Raises:
        ValueError: k outside 1…4, or ``"half"`` with k ≠ 4.
    """
    if not 1 <= k <= MAX_FACTORS:
        raise ValueError(f"k = {k}: 1 to {MAX_FACTORS} factors")
    if design == "half":
        if k != 4:
            raise ValueError("the half fraction is defined here for k = 4 (D = ABC)")
        base = [tuple(reversed(bits)) for bits in itertools.product((0, 1), repeat=3)]
        return [(*row, sum(row) % 2) for row in base]
    return [tuple(reversed(bits)) for bits in itertools.product((0, 1), repeat=k)]


def effect_terms(k: int, design: str = "full") -> list[tuple[int, ...]]:
    """The terms the model estimates, as factor-index tuples: every main effect, then the two-factor interactions
    (all of them in a full design; in the 2^(4−1) fraction one of each aliased pair: AB, AC, AD, which stand for
    AB + CD, AC + BD, AD + BC)."""
    mains = [(i,) for i in range(k)]
    pairs = list(itertools.combinations(range(k), 2))
    if design == "half":
        pairs = [(0, 1), (0, 2), (0, 3)]
    return mains + pairs


def aliases(k: int, design: str = "full") -> dict[str, str]:
    """Term (letters, e.g. ``"AB"``) → what it is aliased with (``"CD"``), for the estimated terms; empty for a full
    design. With I = ABCD a term's alias is the letters it lacks (Box, Hunter & Hunter 2005 ch. 6)."""
    if design != "half":
        return {}
    out = {}
    for term in effect_terms(k, design):
        letters = "".join(LETTERS[i] for i in term)
        out[letters] = "".join(c for c in LETTERS[:k] if c not in letters)
    return out


def arm_name(row: Sequence[int]) -> str:
    """``(1, 0, 1)`` → ``"f101"``: the generated arm's name, one digit per factor in factor order."""
    return "f" + "".join(str(int(bit)) for bit in row)
