"""dsa-bench harness, by stage (data flows one way): :mod:`harness.compare` (a typed request → plan → run → conclusion)
→ :mod:`harness.run` (scenario, plan, servers, load, records) → :mod:`harness.rundir` (the run directory's schema and
store) → :mod:`harness.judge` (statistics and the verdict) → :mod:`harness.gate` (verdict.json, exit code) and
:mod:`harness.render` (report.html, summary.md); :mod:`harness.cli` parses the command line; :mod:`harness.study`
holds calibrate and the design study; :mod:`harness.metrics` the metric registry they all share."""
