"""Pure helpers of the run-directory store: numbers from cells, strict JSON text, CSV text, one-line messages."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ValidationError


def _clean(value: Any) -> Any:
    """JSON without NaN/Infinity (strict parsers reject them): non-finite floats → None, numpy scalars → Python."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, BaseModel):
        return _clean(value.model_dump(mode="json"))
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        return _clean(value.item())
    return value


def json_text(data: Any) -> str:
    """``data`` as indented, strict JSON text (see :func:`_clean`)."""
    return json.dumps(_clean(data), indent=2, ensure_ascii=False, allow_nan=False, default=str) + "\n"


def rows_to_csv(rows: Iterable[Mapping[str, Any] | BaseModel], columns: tuple[str, ...]) -> str:
    """Render ``rows`` as CSV text with exactly ``columns`` (missing keys → empty cells, extra keys ignored)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        row = row.model_dump() if isinstance(row, BaseModel) else row
        writer.writerow({column: ("" if row.get(column) is None else row.get(column)) for column in columns})
    return buffer.getvalue()


def one_line(error: BaseException) -> str:
    """``error``'s message on one line (pandas' parser messages end in a newline)."""
    return " ".join(str(error).split())


def first_error(error: ValidationError, template: str = "{where}: {message}") -> str:
    """The first of pydantic's errors as one line: ``template`` with ``where`` (the dotted location, or
    ``(top level)``) and ``message`` (pydantic's, without its ``Value error,`` prefix), plus ``(+N more)`` when there
    are more."""
    first = error.errors()[0]
    where = ".".join(_printable(str(part)) for part in first.get("loc", ())) or "(top level)"
    message = _printable(str(first.get("msg", "")).removeprefix("Value error, "))
    more = f" (+{error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return template.format(where=where, message=message) + more


def _printable(text: str) -> str:
    """``text`` as is, or as Python's ``ascii()`` writes it when it holds a newline or another control character
    (a key taken from a file may hold one)."""
    return text if text.isprintable() else ascii(text)
