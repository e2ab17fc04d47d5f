"""The lease index: which group and job each live lease id belongs to, and the checks a
call's lease must pass (it lives, its secret matches, it is the named job's in the group).

Kept beside the states, never persisted: rebuilt from the jobs' records on start.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from rlslice._errors import FailedPreconditionError, NotFoundError, PermissionDeniedError
from rlslice.scheduler._runtime import GroupRuntime
from rlslice.scheduler.core import GroupState
from rlslice.scheduler.core.state import JobRecord


def hash_secret(secret: str) -> str:
    """The stored form of a lease secret (high-entropy, so a plain SHA-256 suffices)."""
    return hashlib.sha256(secret.encode()).hexdigest()


class LeaseIndex:
    """Lease id -> (group, job), for every job of every group."""

    def __init__(self) -> None:
        self._owners: dict[str, tuple[str, str]] = {}

    def add_group(self, state: GroupState) -> None:
        """Index every job of a (loaded) group."""
        for record in state.jobs.values():
            self._owners[record.lease_id] = (state.name, record.name)

    def add(self, lease_id: str, group: str, job: str) -> None:
        """Index a lease just opened."""
        self._owners[lease_id] = (group, job)

    def follow(self, before: GroupState, after: GroupState) -> None:
        """Forget the leases of the jobs a transition removed."""
        if len(after.jobs) < len(before.jobs):
            for name, record in before.jobs.items():
                if name not in after.jobs:
                    self._owners.pop(record.lease_id, None)

    def drop_group(self, state: GroupState) -> None:
        """Forget a deleted group's leases."""
        for record in state.jobs.values():
            self._owners.pop(record.lease_id, None)

    def find(
        self, groups: Mapping[str, GroupRuntime], lease_id: str, secret: str
    ) -> tuple[GroupRuntime, JobRecord]:
        """The live lease `lease_id`, once `secret` proves the caller owns it."""
        owner = self._owners.get(lease_id)
        runtime = groups.get(owner[0]) if owner else None
        record = runtime.state.jobs.get(owner[1]) if runtime and owner else None
        if runtime is None or record is None or record.lease_id != lease_id:
            raise NotFoundError(
                "lease_id: no live lease with this id (it lapsed, was closed, or never existed)"
            )
        if not hmac.compare_digest(record.secret_hash, hash_secret(secret)):
            raise PermissionDeniedError("secret: does not match the lease")
        return runtime, record

    def find_job(
        self, groups: Mapping[str, GroupRuntime], group: str, job: str, lease_id: str, secret: str
    ) -> tuple[GroupRuntime, JobRecord]:
        """Like `find`, and the lease must be `job`'s in `group`."""
        if group not in groups:
            raise NotFoundError(f"group: {group!r} does not exist")
        runtime, record = self.find(groups, lease_id, secret)
        if record.name != job:
            raise PermissionDeniedError(f"lease_id: the lease belongs to another job, not {job!r}")
        if runtime.state.name != group:
            raise FailedPreconditionError(
                f"group: job {job!r} is not registered in group {group!r} under this lease"
            )
        return runtime, record
