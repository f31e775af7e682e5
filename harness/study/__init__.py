"""Research tools beside the product: ``dsa-bench calibrate`` (:mod:`.calibrate`) and the run-design study
(:mod:`.design_study` with its design file, per-run analysis and table). They build
:class:`harness.compare.CompareRequest` objects and run real comparisons; only :mod:`harness.cli` and
:mod:`harness.compare` import this package (import-linter contract in ``pyproject.toml``)."""
