"""Research tools beside the product: ``dsa-bench calibrate`` (:mod:`.calibrate`), the run-design study
(:mod:`.design_study` with its design file, per-run analysis and table) and the verdict's error-rate studies on
recorded sessions (:mod:`.regression`). They build :class:`harness.compare.CompareRequest` objects or call the pure
:mod:`harness.judge`; only :mod:`harness.cli` and :mod:`harness.compare` import this package (import-linter contract
in ``pyproject.toml``)."""
