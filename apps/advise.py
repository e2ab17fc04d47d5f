"""`rlslice advise PROFILES...`: which jobs should share which group, and the groups to apply.

Reads phase profiles (YAML from `rlslice profile`, or written by hand), asks the planner's
advisor (`rlslice.planner.advisor.advise`) for the placement with the highest fleet GPU
busy fraction within each job's slowdown bound and the memory of the GPUs and hosts, and
prints a ranked table: the chosen groups, then the other candidate groups, the refused
ones with the bound they break. It can also write:

- `--plot PNG`: predicted busy fraction of each candidate group (chosen, allowed, refused);
- `--tsg-out FILE`: the chosen groups as `TimeSliceGroup` resources (`kubectl apply -f`);
- `--group-config-out FILE`: the same as `rlslice up|scheduler --group-config` reads.

The GPU and host come from flags, or from `--groups FILE`: the groups available, a YAML
list (or `{groups: [...]}`) of `{name, gpu_bytes, host_bytes, rate_gbps, overhead_s,
headroom_bytes, host_reserve_bytes, backend, policy, nodes, node_selector}`. The search
scores on the first group's hardware (groups in a file are taken to be alike) and the
placement's groups take the file's names in order. Without a rate or an overhead, the
profiles' measured copy rate and handoff seconds (medians over the profiles) are used.

Each chosen group of two or more jobs also gets a waiter-ordering policy (`fifo`, `lrs`
or `stage`, simulated with the scheduler's own policy code), with the reason; the
emitted groups carry it (a `policy` in `--groups` wins) and, for `stage`, declare the
profiles' `rollout` and `train` phases as those kinds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlslice.apps.shared.flags import size

if TYPE_CHECKING:
    from rlslice.planner.advisor import Advice, GroupScore, Hardware
    from rlslice.planner.profile import WorkloadProfile

DEFAULT_RATE_GBPS = 25.0
#: The TimeSliceGroup field of the device headroom (a quantity or bytes; the CRD in
#: charts/rlslice names it so).
HEADROOM_FIELD = "headroom"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profiles", nargs="+", type=Path, metavar="PROFILE.yaml")
    parser.add_argument(
        "--max-slowdown", type=float, default=1.2, help="bound of jobs that set none (1.2)"
    )
    parser.add_argument("--groups", type=Path, metavar="FILE", help="the groups available (YAML)")
    for flag, default, what in (
        ("--gpu-bytes", "80GiB", "device memory per GPU"),
        ("--host-bytes", "1TiB", "host memory per node for parking"),
        ("--headroom-bytes", "0", "device bytes kept free per GPU"),
        ("--host-reserve-bytes", "0", "host bytes kept free per node"),
    ):
        parser.add_argument(flag, type=size, default=default, help=f"{what} ({default})")
    parser.add_argument(
        "--rate-gbps", type=float, help="host<->device GB/s per GPU (default: measured, or 25)"
    )
    parser.add_argument(
        "--overhead-s", type=float, help="seconds per switch beyond the copy (default: measured)"
    )
    parser.add_argument("--backend", default="sim", help="backend of the emitted groups")
    parser.add_argument("--max-group-size", type=int, default=4, help="jobs per group (2-4)")
    parser.add_argument("--horizon", type=float, help="simulated seconds per candidate")
    parser.add_argument("--top", type=int, default=10, help="other candidates to list")
    parser.add_argument("--name-prefix", default="shared", help="names of emitted groups")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="write a plot")
    parser.add_argument("--tsg-out", type=Path, metavar="FILE", help="TimeSliceGroup YAML")
    parser.add_argument("--group-config-out", type=Path, metavar="FILE", help="group config YAML")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from rlslice._errors import InvalidArgumentError
    from rlslice.planner.advisor import advise

    try:
        profiles = load_profile_files(args.profiles)
        groups = _load_groups(args.groups) if args.groups else []
        hardware = hardware_from(args, groups[0] if groups else {}, profiles)
        if not 1 <= args.max_group_size <= 4:
            raise InvalidArgumentError("--max-group-size: must be between 1 and 4")
        advice = advise(
            profiles,
            hardware,
            max_slowdown=args.max_slowdown,
            max_group_size=args.max_group_size,
            max_groups=len(groups) if groups else None,
            horizon_s=args.horizon,
            policies=advice_pickers(),
        )
    except (OSError, ValueError, ValidationError, InvalidArgumentError) as error:
        print(f"advise: {error}", file=sys.stderr)
        return 2
    names = group_names(advice, groups, args.name_prefix)
    specs = group_specs(advice, names, groups, args.backend, profiles, hardware)
    if args.tsg_out is not None:
        args.tsg_out.write_text(time_slice_groups_yaml(specs))
    if args.group_config_out is not None:
        args.group_config_out.write_text(group_config_yaml(specs))
    if args.plot is not None:
        plot_advice(advice, args.plot, top=args.top)
    if args.json:
        print(json.dumps(advice_json(advice, names, hardware), indent=2))
    else:
        print_advice(advice, names, hardware, top=args.top)
        for path in (args.tsg_out, args.group_config_out, args.plot):
            if path is not None:
                print(f"wrote {path}")
    return 1 if advice.problems else 0


#: The policies `rlslice advise` weighs (priority and fair encode intent, not throughput).
ADVISED_POLICIES = ("fifo", "lrs", "stage")
#: Phase names the advice declares as phase kinds (`rlslice profile` names phases so).
ADVISED_PHASE_KINDS = {"rollout": "rollout", "train": "train"}


def advice_pickers() -> dict[str, Any]:
    """The scheduler's policies as the advisor's pickers, phase kinds declared."""
    from rlslice.apps.shared.sim_policies import phase_table, picker

    kinds = phase_table(ADVISED_PHASE_KINDS)
    return {name: picker(name, kinds) for name in ADVISED_POLICIES}


def load_profile_files(paths: list[Path]) -> list[WorkloadProfile]:
    """Every profile in `paths` (a file may hold one profile or `{profiles: [...]}`)."""
    import yaml

    from rlslice.planner.profile import load_profiles

    out: list[WorkloadProfile] = []
    for path in paths:
        try:
            out.extend(load_profiles(yaml.safe_load(path.read_text())))
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
    return out


def _load_groups(path: Path) -> list[dict[str, Any]]:
    import yaml

    data = yaml.safe_load(path.read_text()) or []
    items = data.get("groups", []) if isinstance(data, dict) else data
    if not isinstance(items, list) or not all(isinstance(i, dict) and "name" in i for i in items):
        raise ValueError(f"{path}: expected a list of groups, each with a name")
    return items


def hardware_from(
    args: argparse.Namespace, group: dict[str, Any], profiles: list[WorkloadProfile]
) -> Hardware:
    """The hardware of the search: `group` (from `--groups`) over the flags; rate and
    overhead fall back to the profiles' measurements."""
    from statistics import median

    from rlslice.planner.advisor import Hardware
    from rlslice.planner.profile import parse_bytes

    rates = [
        p.switching.bandwidth_bytes_per_s
        for p in profiles
        if p.switching and p.switching.bandwidth_bytes_per_s
    ]
    handoffs = [
        p.switching.handoff_seconds.p50
        for p in profiles
        if p.switching and p.switching.handoff_seconds
    ]
    rate = group.get("rate_gbps", args.rate_gbps)
    overhead = group.get("overhead_s", args.overhead_s)
    return Hardware(
        gpu_bytes=parse_bytes(group.get("gpu_bytes", args.gpu_bytes)),
        host_bytes=parse_bytes(group.get("host_bytes", args.host_bytes)),
        bandwidth_bytes_per_s=(
            float(rate) * 1e9 if rate is not None else median(rates or [DEFAULT_RATE_GBPS * 1e9])
        ),
        overhead_s=float(overhead) if overhead is not None else median(handoffs or [0.0]),
        headroom_bytes=parse_bytes(group.get("headroom_bytes", args.headroom_bytes)),
        host_reserve_bytes=parse_bytes(group.get("host_reserve_bytes", args.host_reserve_bytes)),
        backend=str(group.get("backend", args.backend)),
    )


def group_names(advice: Advice, groups: list[dict[str, Any]], prefix: str) -> list[str]:
    """A name per chosen group: the `--groups` file's, in order, then `<prefix>-<n>`."""
    names = [str(g["name"]) for g in groups[: len(advice.groups)]]
    names += [f"{prefix}-{n}" for n in range(len(names) + 1, len(advice.groups) + 1)]
    return names


def group_specs(
    advice: Advice,
    names: list[str],
    groups: list[dict[str, Any]],
    backend: str,
    profiles: list[WorkloadProfile],
    hardware: Hardware,
) -> list[Any]:
    """The chosen groups as `rlslice.config.GroupSpec` values."""
    from rlslice.config import GroupSpec, JobSpec, PhaseKind, PhaseSpec, Policy

    by_name = {p.name: p for p in profiles}
    specs = []
    for index, (score, name) in enumerate(zip(advice.groups, names, strict=True)):
        extra = groups[index] if index < len(groups) else {}
        policy = str(extra.get("policy", score.policy))
        used = {phase.name for j in score.jobs for phase in by_name[j].phases}
        phases = {
            phase: PhaseSpec(kind=PhaseKind(kind))
            for phase, kind in ADVISED_PHASE_KINDS.items()
            if policy == "stage" and phase in used
        }
        specs.append(
            GroupSpec(
                name=name,
                policy=Policy(policy),
                phases=phases,
                backend=str(extra.get("backend", backend)),
                headroom_bytes=hardware.headroom_bytes,
                nodes=tuple(extra.get("nodes", ())),
                node_selector=dict(extra.get("node_selector", {})),
                jobs=tuple(
                    JobSpec(name=j, priority=by_name[j].priority, weight=by_name[j].weight)
                    for j in score.jobs
                ),
            )
        )
    return specs


def _header(score: GroupScore) -> str:
    slowdowns = ", ".join(f"{j} {s:.2f}x" for j, s in zip(score.jobs, score.slowdowns, strict=True))
    return f"# advised: busy {score.busy_fraction:.2f}, slowdown {slowdowns}"


def time_slice_groups_yaml(specs: list[Any]) -> str:
    """`TimeSliceGroup` resources (one YAML document each) with only the fields the CRD
    defines and the advice sets: backend, policy, jobs (weights rounded to the CRD's whole
    numbers; the group config keeps them exact), headroom (bytes) and the node selector
    (`matchLabels`) when given."""
    import yaml

    documents = []
    for spec in specs:
        body: dict[str, Any] = {"backend": spec.backend, "policy": spec.policy.value}
        if spec.phases:
            body["phases"] = {name: {"kind": p.kind.value} for name, p in spec.phases.items()}
        if spec.headroom_bytes:
            body[HEADROOM_FIELD] = spec.headroom_bytes
        if spec.node_selector:
            body["nodeSelector"] = {"matchLabels": dict(spec.node_selector)}
        jobs = []
        for job in spec.jobs:
            item: dict[str, Any] = {"name": job.name}
            if job.priority:
                item["priority"] = job.priority
            if job.weight != 1.0:  # the CRD's weights are whole numbers, at least 1
                item["weight"] = max(1, round(job.weight))
            jobs.append(item)
        body["jobs"] = jobs
        resource = {
            "apiVersion": "rlslice.dev/v1alpha1",
            "kind": "TimeSliceGroup",
            "metadata": {"name": spec.name},
            "spec": body,
        }
        documents.append(yaml.safe_dump(resource, sort_keys=False))
    return "---\n".join(documents)


def group_config_yaml(specs: list[Any]) -> str:
    """The `--group-config` file (`rlslice.config.load_group_config` reads it)."""
    import yaml

    groups = [s.model_dump(mode="json", exclude_defaults=True) for s in specs]
    for spec, item in zip(specs, groups, strict=True):
        item["name"] = spec.name
        item["backend"] = spec.backend  # always say it: the default may differ elsewhere
    return yaml.safe_dump({"groups": groups}, sort_keys=False)


def _slowdowns(score: GroupScore) -> str:
    if not score.simulated and len(score.jobs) > 1:
        return f"largest >= {max(score.slowdowns):.2f}x"
    return ", ".join(f"{s:.2f}x" for s in score.slowdowns)


def print_advice(advice: Advice, names: list[str], hardware: Hardware, *, top: int) -> None:
    """The ranked table: chosen groups, other candidates, refused ones with the bound."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    chosen = Table(
        title=(
            f"Advised placement: {sum(len(g.jobs) for g in advice.groups)} jobs on "
            f"{len(advice.groups)} groups, fleet GPU busy {advice.dedicated_busy_fraction:.2f} "
            f"dedicated -> {advice.busy_fraction:.2f} ({advice.method}, "
            f"{advice.evaluations} simulated, {advice.pruned} pruned)"
        )
    )
    for column in ("group", "pairing", "busy", "slowdowns", "switches/h"):
        chosen.add_column(column, justify="left" if column in ("group", "pairing") else "right")
    for name, score in zip(names, advice.groups, strict=True):
        chosen.add_row(
            name,
            score.label,
            f"{score.busy_fraction:.3f}",
            _slowdowns(score),
            f"{score.switches_per_hour:.0f}",
        )
    console.print(chosen)
    for name, score in zip(names, advice.groups, strict=True):
        if score.policy_reason:
            console.print(f"{name} policy: {score.policy_reason}")
    rest = [c for c in advice.candidates if c not in advice.groups]
    others = [c for c in rest if c.allowed][:top] + [c for c in rest if not c.allowed][:top]
    if others:
        table = Table(title="Other candidate groups, ranked (allowed, then refused)")
        for column in ("pairing", "busy", "slowdowns", "switches/h", "verdict"):
            table.add_column(
                column, justify="left" if column in ("pairing", "verdict") else "right"
            )
        for score in others:
            table.add_row(
                score.label,
                f"{score.busy_fraction:.3f}",
                _slowdowns(score),
                f"{score.switches_per_hour:.0f}" if score.simulated else "-",
                "allowed" if score.allowed else "refused: " + "; ".join(score.problems),
            )
        console.print(table)
    console.print(
        f"switch cost: {hardware.bandwidth_bytes_per_s / 1e9:.2f} GB/s, "
        f"{hardware.overhead_s:.3f} s overhead per switch"
    )
    for problem in advice.problems:
        console.print(f"problem: {problem}")


def advice_json(advice: Advice, names: list[str], hardware: Hardware) -> dict[str, Any]:
    """The advice as one JSON object."""

    def row(score: GroupScore) -> dict[str, Any]:
        return {
            "jobs": list(score.jobs),
            "busy_fraction": round(score.busy_fraction, 4),
            "slowdowns": {j: round(s, 4) for j, s in zip(score.jobs, score.slowdowns, strict=True)},
            "switches_per_hour": round(score.switches_per_hour, 1),
            "simulated": score.simulated,
            "problems": list(score.problems),
            "policy": score.policy,
            "policy_reason": score.policy_reason,
        }

    return {
        "busy_fraction": round(advice.busy_fraction, 4),
        "dedicated_busy_fraction": round(advice.dedicated_busy_fraction, 4),
        "method": advice.method,
        "evaluations": advice.evaluations,
        "pruned": advice.pruned,
        "bandwidth_bytes_per_s": hardware.bandwidth_bytes_per_s,
        "overhead_s": hardware.overhead_s,
        "groups": [{"name": n, **row(s)} for n, s in zip(names, advice.groups, strict=True)],
        "candidates": [row(c) for c in advice.candidates],
        "problems": list(advice.problems),
    }


def bound_broken(problem: str) -> str:
    """The name of the bound a refusal sentence is about: slowdown, demand, device or host memory."""
    for bound in ("device memory", "host memory", "demand", "slowdown"):
        if bound in problem:
            return bound
    return problem


def plot_advice(advice: Advice, path: Path, *, top: int = 10) -> Path:
    """A bar per candidate group (chosen green, allowed blue, refused red), the dedicated
    fleet busy fraction as a dashed line; refused bars name the bound they break."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    chosen = [g for g in advice.groups if len(g.jobs) > 1]
    rest = [c for c in advice.candidates if c not in chosen]
    rows = chosen + [c for c in rest if c.allowed][:top] + [c for c in rest if not c.allowed][:top]
    figure = Figure(figsize=(10, 1.2 + 0.38 * max(1, len(rows))))
    axes = figure.add_subplot()
    for index, score in enumerate(rows):
        colour = "#2ca02c" if score in chosen else "#1f77b4" if score.allowed else "#d62728"
        axes.barh(index, score.busy_fraction, color=colour, height=0.7)
        note = _slowdowns(score)
        if not score.allowed:
            note += f"  refused: {bound_broken(score.problems[0])}"
        axes.text(score.busy_fraction + 0.01, index, note, va="center", fontsize="x-small")
    axes.axvline(advice.dedicated_busy_fraction, color="#555555", linestyle="--", linewidth=1)
    axes.set_yticks(range(len(rows)), [s.label for s in rows], fontsize="small")
    axes.set_ylim(len(rows) - 0.5, -0.5)
    axes.set_xlim(0, 1.6)
    axes.set_xlabel("predicted GPU busy fraction of the group")
    axes.set_title(
        f"rlslice advise: fleet busy {advice.dedicated_busy_fraction:.2f} dedicated -> "
        f"{advice.busy_fraction:.2f} advised"
    )
    axes.legend(
        handles=[
            Patch(color="#2ca02c", label="chosen"),
            Patch(color="#1f77b4", label="allowed"),
            Patch(color="#d62728", label="refused"),
            Line2D([], [], color="#555555", linestyle="--", label="all jobs dedicated"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        fontsize="small",
        frameon=False,
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    return path


__all__ = [
    "advice_json",
    "bound_broken",
    "group_config_yaml",
    "group_specs",
    "hardware_from",
    "load_profile_files",
    "plot_advice",
    "print_advice",
    "time_slice_groups_yaml",
]
