"""Where the scheduler keeps state across restarts: `Store` protocol, memory and SQLite."""

from __future__ import annotations

from pathlib import Path

from rlslice.scheduler.store.base import AgentRecord, FencedStore, Loaded, Store, StoreError
from rlslice.scheduler.store.memory import MemoryStore
from rlslice.scheduler.store.sqlite import SQLiteStore

__all__ = [
    "AgentRecord",
    "FencedStore",
    "Loaded",
    "MemoryStore",
    "SQLiteStore",
    "Store",
    "StoreError",
    "open_store",
]


def open_store(spec: str | Path) -> Store:
    """`"memory"`, `"kubernetes[:prefix]"` (ConfigMaps in this pod's namespace), or a path
    to a SQLite file (created if missing)."""
    if str(spec) == "memory":
        return MemoryStore()
    if str(spec) == "kubernetes" or str(spec).startswith("kubernetes:"):
        from rlslice.scheduler.store.kubernetes import KubernetesStore

        return KubernetesStore.from_spec(str(spec))
    return SQLiteStore(spec)
