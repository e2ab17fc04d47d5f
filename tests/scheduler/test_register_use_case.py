"""Register as a use case of the engine (`Engine.register_job`), over a stand-in for the
agents that counts its Status fan-outs.

Cases:
- one fan-out per Register, whatever is checked (capacity and lock only);
- a job no agent knows is let in lock only: warned, counted, and kept in its job record,
  so it survives the store's codec; it leaves with the job (registered again once an agent
  knows it, it is not lock only);
- a group requiring agent registration refuses it, after the capacity rule;
- a group without agents is a pure lock: no fan-out, nothing to warn about.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from rlslice._errors import FailedPreconditionError, ResourceExhaustedError
from rlslice.config import GroupSpec
from rlslice.scheduler.core.registration import AgentSurvey
from rlslice.scheduler.store.codec import decode_group, encode_group

from .conftest import Runner, engine_on_loop

pytestmark = pytest.mark.looptime

GIB = 1 << 30


@dataclass
class Agents(Runner):
    """One node, n1, whose agent knows `known` (job, group) pairs and has `parking` bytes."""

    nodes: tuple[str, ...] = ("n1",)
    known: set[tuple[str, str]] = field(default_factory=set)
    parking: int = 8 * GIB
    surveys: int = 0

    async def survey(self, spec: GroupSpec) -> AgentSurvey:
        self.surveys += 1
        return AgentSurvey({"n1": tuple(sorted(self.known))}, {"n1": self.parking})


async def test_a_register_asks_the_agents_once_for_capacity_and_lock_only() -> None:
    agents = Agents(known={("a", "g")})
    async with engine_on_loop(runner=agents) as engine:
        done = await engine.register_job("g", "a", 30, None, None, GIB)
        assert agents.surveys == 1
        assert done.warning == ""
        assert not engine.groups["g"].state.jobs["a"].lock_only


async def test_a_job_no_agent_knows_is_lock_only_in_its_record_until_it_leaves() -> None:
    agents = Agents()
    async with engine_on_loop(runner=agents) as engine:
        done = await engine.register_job("g", "a", 30, None, None, 0)
        assert "known to no agent of group 'g'" in done.warning
        state = engine.groups["g"].state
        assert state.jobs["a"].lock_only
        assert decode_group(encode_group(state)).jobs["a"].lock_only  # stored with the job
        metric = engine.metrics.lock_only.labels("g")._value.get()
        assert metric == 1
        engine.unregister(done.lease_id, done.secret)
        await agents.released.wait()  # its state is released on the node, as any job's
        assert "a" not in engine.groups["g"].state.jobs
        agents.known.add(("a", "g"))
        again = await engine.register_job("g", "a", 30, None, None, 0)
        assert again.warning == ""
        assert not engine.groups["g"].state.jobs["a"].lock_only
        assert agents.surveys == 2


async def test_a_group_requiring_agent_registration_refuses_after_the_capacity_rule() -> None:
    agents = Agents(parking=GIB)
    async with engine_on_loop(runner=agents) as engine:
        engine.put_group(GroupSpec(name="g", require_agent_registration=True))
        with pytest.raises(ResourceExhaustedError, match="could not be parked"):
            await engine.register_job("g", "a", 30, None, None, 4 * GIB)
        with pytest.raises(FailedPreconditionError, match="requires agent registration"):
            await engine.register_job("g", "a", 30, None, None, 0)
        assert agents.surveys == 2
        assert "a" not in engine.groups["g"].state.jobs


async def test_a_group_without_agents_registers_without_asking_anyone() -> None:
    agents = Agents(nodes=())
    async with engine_on_loop(runner=agents) as engine:
        done = await engine.register_job("g", "a", 30, None, None, GIB)
        assert done.warning == ""
        assert agents.surveys == 0
        assert not engine.groups["g"].state.jobs["a"].lock_only
