"""`rlslice status` names the parts of a partly parked job (issue 26).

Cases, in the plain table's "parked" column:

| the parked job's record | shown |
|---|---|
| parked p3, discarded p0 | `job-a (parked p3; discarded p0)` |
| only discarded p0 | `job-b (discarded p0)` |
| parked whole (no parts listed) | `job-c` alone |
"""

from __future__ import annotations

import pytest

from rlslice.apps import status as status_cli
from rlslice.v1alpha1 import scheduler_pb2 as pb


def _group() -> pb.GroupStatus:
    parked = pb.JOB_STATE_PARKED
    return pb.GroupStatus(
        spec=pb.GroupSpec(name="g"),
        holder="job-d",
        parked=["job-a", "job-b", "job-c"],
        jobs=[
            pb.JobStatus(job="job-a", state=parked, parked_parts=["p3"], discarded_parts=["p0"]),
            pb.JobStatus(job="job-b", state=parked, discarded_parts=["p0"]),
            pb.JobStatus(job="job-c", state=parked),
            pb.JobStatus(job="job-d", state=pb.JOB_STATE_HOLDING),
        ],
    )


def test_the_parked_column_names_each_partly_parked_jobs_parts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status_cli._table([_group()])
    header, row = capsys.readouterr().out.splitlines()
    assert "parked" in header
    assert "job-a (parked p3; discarded p0), job-b (discarded p0), job-c" in row


def test_the_json_lists_the_parts_of_each_job() -> None:
    jobs = {j["job"]: j for j in status_cli.as_json(_group())["jobs"]}
    assert jobs["job-a"]["parked_parts"] == ["p3"]
    assert jobs["job-a"]["discarded_parts"] == ["p0"]
    assert "parked_parts" not in jobs["job-c"]
