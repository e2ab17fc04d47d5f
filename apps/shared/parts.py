"""How a command names the parts of a partly parked job (issue 26), in one wording for
`rlslice status` and `rlslice timeline`: `parked p3; discarded p0` (the tags in host
memory, then the tags of discard parts freed and not yet told to the job), after the job
as `job-a (parked p3; discarded p0)`. A job parked whole lists no parts and stands alone."""

from __future__ import annotations

from collections.abc import Iterable


def parts_words(parked: Iterable[str], discarded: Iterable[str]) -> str:
    """`parked p3; discarded p0`, leaving out an empty list; empty when both are."""
    bits = [
        f"{word} {' '.join(tags)}"
        for word, tags in (("parked", tuple(parked)), ("discarded", tuple(discarded)))
        if tags
    ]
    return "; ".join(bits)


def job_with_parts(job: str, parked: Iterable[str], discarded: Iterable[str]) -> str:
    """`job-a (parked p3; discarded p0)`, or `job-a` alone when no parts are listed."""
    words = parts_words(parked, discarded)
    return f"{job} ({words})" if words else job


__all__ = ["job_with_parts", "parts_words"]
