"""The process's C heap: handing the pages it freed back to the operating system.

Layer: io.

glibc keeps freed pages mapped for reuse, so a long-running process stays at its high-water
mark; ``malloc_trim`` returns the free pages of every arena. Why a grouping source calls it:
docs/design.md#grouping-stage.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to hand back this way
        return None


def release_freed_heap() -> bool:
    """Hand the free pages of the C heap back to the OS; False where the C library has no
    ``malloc_trim`` or had nothing to release.

    >>> release_freed_heap() in (True, False)
    True
    """
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
