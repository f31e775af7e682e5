#!/usr/bin/env bash
# Install what the tests need, then run them. Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"`.
# No arguments: the fast suite plus the slow end-to-end tests that fit CI's budget (pyproject's addopts leave out the
# heavy tier; `-m heavy` runs it). CI runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The HTML report is checked in headless Chromium (a Debian package).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "scripts/test.sh: could not install chromium; the browser test will be skipped" >&2
fi
# --durations=25: the slowest tests in every CI log (tests/SLOW.md keeps the inventory of the slow ones).
exec .venv/bin/python -m pytest --durations=25 "$@"
