"""Which backend serves a job on this node, and the backends themselves, created on first use.

The one place that knows the agent's backend names: those installed on this node (the
`rlslice.backends` entry points that loaded here, or the ones a test hands in). A spec's
names are checked against every shipped or plugged-in backend by
`rlslice.config.validate_backend`; a node can only serve what is installed on it, so the
agent's rule is narrower and lives here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from rlslice._errors import FailedPreconditionError, InvalidArgumentError
from rlslice._ids import validate_id
from rlslice.snapshot_agent.backends import BackendEntry, installed_backends
from rlslice.snapshot_agent.backends.base import Backend, BackendContext, ProbeResult
from rlslice.snapshot_agent.jobs import JobEntry
from rlslice.snapshot_agent.state import Move


class BackendRegistry:
    """The backends installed on one node, their instances and their probe results."""

    def __init__(
        self,
        *,
        node: str,
        state_dir: Path,
        default: str,
        options: Callable[[str], Mapping[str, str]],
        entries: Mapping[str, BackendEntry] | None = None,
        wrap: Callable[[Backend], Backend] | None = None,
    ) -> None:
        self.node = node
        self._wrap = wrap  # puts a backend behind the disk tier (`tiering.Tiering.wrap`)
        self.default = default
        self._state_dir = state_dir
        self._options = options
        self._entries = dict(entries) if entries is not None else installed_backends()
        self._backends: dict[str, Backend] = {}
        self._probes: dict[str, ProbeResult] = {}

    # -- names -------------------------------------------------------------------------

    @staticmethod
    def check_asked(name: str) -> None:
        """A backend a move asks for: empty (the job's own) or a well-formed name. Whether
        it is installed is told when the move needs it (a move answered absent or
        repeated never does)."""
        if name:
            validate_id(name, "backend")

    def require_installed(self, name: str) -> None:
        """A backend a job registers with: empty (the default) or installed here."""
        if name and name not in self._entries:
            raise InvalidArgumentError(f"backend: {name!r} is not installed on this node")

    def serving(self, entry: JobEntry) -> str:
        """The backend that holds `entry`'s state: the one that parked it, else the one it
        registered with, else this node's default."""
        return entry.record.backend or entry.backend or self.default

    def for_move(self, entry: JobEntry, move: Move, asked: str) -> str:
        """The backend to run `move` of `entry` with, `asked` by the caller (or empty)."""
        record = entry.record
        if move is Move.RESTORE and record.backend:
            # State parked by one backend comes back through the same one.
            if asked and asked != record.backend:
                raise FailedPreconditionError(
                    f"backend: job {record.job} was parked by {record.backend!r}, not {asked!r}"
                )
            return record.backend
        return asked or entry.backend or self.default

    # -- instances ---------------------------------------------------------------------

    def loaded(self, name: str) -> Backend | None:
        """The backend `name` if it was created already (and is usable), else None."""
        return self._backends.get(name)

    def instances(self) -> list[Backend]:
        """Every backend created so far."""
        return list(self._backends.values())

    async def get(self, name: str) -> Backend:
        """The backend `name`, created on first use; refuses one that is not usable here."""
        if name in self._backends:
            return self._backends[name]
        entry = self._entries.get(name)
        if entry is None:
            installed = ", ".join(self._entries) or "none"
            raise InvalidArgumentError(
                f"backend: {name!r} is not installed on node {self.node} (installed: {installed})"
            )
        if entry.cls is None:
            raise FailedPreconditionError(
                f"backend: {name!r} cannot load on node {self.node}: {entry.error}"
            )
        known = self._probes.get(name)
        if known is None:
            known = await self._create(name, entry.cls)
        if not known.usable:
            raise FailedPreconditionError(
                f"backend: {name!r} is not usable on node {self.node}: {known.detail}"
            )
        return self._backends[name]

    async def _create(self, name: str, cls: type[Backend]) -> ProbeResult:
        context = BackendContext(
            node=self.node,
            state_dir=self._state_dir / "backends" / name,
            options=dict(self._options(name)),
        )
        try:
            context.state_dir.mkdir(parents=True, exist_ok=True)
            instance = cls(context)
            probe = await instance.probe()
        except Exception as error:  # a backend that cannot even start is unusable here
            probe = ProbeResult(False, f"failed to start: {type(error).__name__}: {error}")
        else:
            if probe.usable:
                self._backends[name] = instance if self._wrap is None else self._wrap(instance)
        self._probes[name] = probe
        return probe

    async def probe(self) -> list[tuple[str, ProbeResult]]:
        """Every installed backend: usable here or why not."""
        results: list[tuple[str, ProbeResult]] = []
        for name, entry in self._entries.items():
            if entry.cls is None:
                results.append((name, ProbeResult(False, f"cannot load: {entry.error}")))
                continue
            probe = self._probes.get(name) or await self._create(name, entry.cls)
            results.append((name, probe))
        return results
