"""Plain-text forms of run-directory values for the report page (the template escapes them)."""

from __future__ import annotations

import json
from typing import Any


def show(value: Any) -> str:
    """A manifest value as text: strings as they are, ``None`` as ``—``, anything else as compact JSON."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)
