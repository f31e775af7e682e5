"""The one cache of generated tiny models: ``$DSA_BENCH_CACHE`` (or ``~/.cache/dsa-bench``), one directory per
preset and content hash, built under a temporary name and renamed into place."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def default_cache_dir() -> Path:
    """``$DSA_BENCH_CACHE`` if set and non-empty, else ``~/.cache/dsa-bench``."""
    env = os.environ.get("DSA_BENCH_CACHE", "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dsa-bench"


def ensure_dir(final: Path, marker: str, write: Callable[[Path], None]) -> Path:
    """``final``, built by ``write(tmp)`` into a fresh directory next to it unless ``final/marker`` exists already.

    Idempotent: a complete directory (its ``marker`` file written last) is returned as is. Atomic: built under a
    temporary name and renamed; if another process wins the race its (identical) directory is kept and ours
    discarded; a stale incomplete directory in the way is replaced.

    Raises:
        OSError: the rename fails with no complete directory in place (a real failure, not a race).
    """
    if (final / marker).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        write(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / marker).is_file():
                shutil.rmtree(final, ignore_errors=True)
                try:
                    os.rename(tmp, final)
                except OSError:
                    if not (final / marker).is_file():
                        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
