"""Start-up leaves the long-lived heap out of the collector's generations.

Cases: once a scheduler has started, the objects made before (modules, classes, the loaded
store) are frozen, so a full collection walks only what was made since; starting a second
scheduler in the same process does not freeze again (unless something unfroze the heap).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any


async def test_start_up_freezes_the_heap_once(start_live: Callable[..., Any]) -> None:
    async with start_live():
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # grpc, protobuf and pydantic alone are tens of thousands
        async with start_live():
            # No second freeze: the count only shrinks as frozen objects are freed.
            assert gc.get_freeze_count() <= frozen
