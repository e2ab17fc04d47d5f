"""A real Prometheus scrapes a real scheduler and agent; every dashboard and rule query finds
its series with the labels it needs, so a renamed metric or label breaks a test.

Set up once for the module:
- kmock's emulated Kubernetes API (Leases, ConfigMaps) behind the chart's defaults: the
  `kubernetes` store and leader election, so the leading replica exports
  `rlslice_scheduler_leader` and every alert of the chart is rendered;
- an `ElectedScheduler` that leads, with group `g` on the `sim` backend, max_hold_seconds
  set so that a holder is preempted;
- agents `n1` and `n2` on the `sim` backend, with real job processes a, b (group `g`, on
  n1) and x, y (group `f`, on n2); n2 keeps all host memory in reserve, so it refuses
  every snapshot;
- Prometheus (Debian's binary, 127.0.0.1, its TSDB in a temporary folder, started and
  stopped by pid) scraping all three every second and evaluating the chart's rendered rules.
  The targets carry the labels the Prometheus Operator gives the targets of the chart's
  ServiceMonitor and PodMonitor, with the rendered Service's and DaemonSet's names.

Driven with real clients: a holds, b waits, a yields (a is snapshotted); a waits, b yields
(a is restored); c, a job no agent knows (lock only), waits and is granted; b waits and c,
holding past max_hold_seconds, is preempted. In f, x holds, y waits, x yields: n2 refuses
the snapshot, the switch fails (retried, then y's acquire fails with the reason).

Case matrix:

| checked | how |
|---|---|
| every target up with the chart's labels | /api/v1/targets |
| every dashboard query | /api/v1/query (`$group` = `.*`, `$__rate_interval` = 30s) returns series, each with the labels its legend and `by (...)` name |
| every rule's query | the expression without its final comparison returns series with the labels its annotations and `by (...)` use; f's failures counted whole (a series younger than the window) |
| every selector alone | each `rlslice_*{...}` of the dashboard and the rules, as written, returns series |
| the rules in Prometheus | each rule evaluates with health ok; RlsliceSwitchFailures fires for f, and no other alert stays |
| exemptions | series that only an event the drive cannot make creates (`EXEMPT`, a reason each; empty today): their metric names are in the scrape, and each exemption is still used |

Samples and readiness are waited for by polling with a deadline (60 s), never by sleeping.
Without `prometheus` the module skips, or fails when RLSLICE_REQUIRE_PROMETHEUS=1 (CI).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock
import pytest
import pytest_asyncio

from rlslice import ResourceExhaustedError
from rlslice.adapters.kube import KubeAPI
from rlslice.client import AsyncClient
from rlslice.config import GroupSpec
from rlslice.scheduler import SchedulerSettings
from rlslice.scheduler.leader import ElectedScheduler, LeaseElector
from rlslice.snapshot_agent import AgentSettings, RunningAgent, SimSettings, start_agent
from rlslice.snapshot_agent.processes import identify

from .prometheus_kit import (
    CHART,
    NAMESPACE,
    Prometheus,
    find,
    helm_binary,
    poll,
    render,
    require_tool,
    rules_file,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

DASHBOARD = CHART / "dashboards" / "rlslice.json"
DEADLINE = 60.0
SERIES = re.compile(r"\b(rlslice_[a-z0-9_]+)(\s*\{[^}]*\})?")
BY = re.compile(r"\bby\s*\(([^)]*)\)")
LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
RULE_LABEL = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)")
COMPARISON = re.compile(r"^(?P<value>.+?)\s*(?:>=|<=|==|!=|>|<)\s*-?[0-9.]+$", re.DOTALL)


@dataclass(frozen=True)
class Exemption:
    """Series of `metric` with `matchers` exist only after an event the drive cannot make."""

    metric: str
    matchers: str
    reason: str


#: Selectors whose series only an event the drive cannot make creates, each with its
#: reason (e.g. `Exemption("rlslice_scheduler_switches_total", 'outcome="faulted"', "...")`
#: if a selector named faulted switches alone). Empty today: the drive makes every series
#: the dashboard and the rules query, a failed switch included.
EXEMPT: tuple[Exemption, ...] = ()


@dataclass(frozen=True)
class Query:
    """One query to run: where it comes from, the PromQL, the labels each series needs."""

    source: str
    expr: str
    labels: frozenset[str]

    def exemption(self) -> Exemption | None:
        for name, braces in SERIES.findall(self.expr):
            for exemption in EXEMPT:
                if name == exemption.metric and exemption.matchers in braces:
                    return exemption
        return None


def grouped_by(expr: str) -> set[str]:
    """Labels of every `by (...)` in `expr` except `le` (histogram_quantile consumes it)."""
    return {label.strip() for group in BY.findall(expr) for label in group.split(",")} - {"", "le"}


def dashboard_queries() -> list[Query]:
    """Every panel target of the dashboard, with Grafana's variables filled in."""
    board = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "30s").replace("$group", ".*")
            legend = set(LEGEND.findall(target.get("legendFormat", "")))
            queries.append(
                Query(
                    f"{panel['title']} [{target['refId']}]",
                    expr,
                    frozenset(legend | grouped_by(expr)),
                )
            )
    return queries


def rule_queries(rules: list[dict[str, Any]]) -> list[Query]:
    """Each alert's expression without its final comparison (so a quiet alert has series)."""
    queries = []
    for rule in rules:
        match = COMPARISON.match(rule["expr"].strip())
        assert match, f"{rule['alert']}: no final comparison with a number in {rule['expr']!r}"
        value = match.group("value")
        templates = " ".join(
            [*rule.get("annotations", {}).values(), *rule.get("labels", {}).values()]
        )
        labels = set(RULE_LABEL.findall(templates)) | grouped_by(value)
        queries.append(Query(rule["alert"], value, frozenset(labels)))
    return queries


def selectors(queries: list[Query]) -> list[Query]:
    """Each metric selector of `queries` on its own, as written (matchers included)."""
    seen: dict[str, Query] = {}
    for query in queries:
        for name, braces in SERIES.findall(query.expr):
            expr = f"{name}{braces.strip()}"
            seen.setdefault(expr, Query(f"{query.source}: {expr}", expr, frozenset()))
    return list(seen.values())


@dataclass
class Live:
    """The running stack the tests query."""

    prometheus: Prometheus
    chart: Chart

    async def answers(self, queries: list[Query]) -> dict[Query, list[dict[str, Any]]]:
        """Each query's series, once every query that is not exempt has some (or fail)."""

        def all_found() -> dict[Query, list[dict[str, Any]]] | None:
            found = {q: self.prometheus.query(q.expr) for q in queries}
            missing = [q for q, series in found.items() if not series and not q.exemption()]
            return None if missing else found

        try:
            return await asyncio.to_thread(poll, all_found, DEADLINE, "series of every query")
        except AssertionError:
            empty = [
                q.source for q in queries if not q.exemption() and not self.prometheus.query(q.expr)
            ]
            raise AssertionError(f"no series within {DEADLINE:g} s for: {empty}") from None


@pytest.fixture(scope="module")
def short_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="rp-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


async def until(check: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def job_pids() -> AsyncIterator[dict[str, int]]:
    """Real processes for jobs a, b (node n1) and x, y (node n2), which the sim backend
    freezes and thaws."""
    processes = {
        job: await asyncio.create_subprocess_exec("sleep", "600", stdin=asyncio.subprocess.DEVNULL)
        for job in "abxy"
    }
    yield {job: p.pid for job, p in processes.items()}
    for process in processes.values():
        process.kill()
        await process.wait()


@dataclass(frozen=True)
class Chart:
    """What the chart renders that the live stack copies: rules and target labels."""

    rules: list[dict[str, Any]]
    scheduler_job: str
    agent_job: str
    scheduler_labels: dict[str, str]
    daemonset: str

    def agent_labels(self, node: str) -> dict[str, str]:
        """The PodMonitor target labels of the agent pod on `node`."""
        return {"namespace": NAMESPACE, "pod": f"{self.daemonset}-{node}abc", "endpoint": "metrics"}


def chart(folder: Path) -> Chart:
    """Render the chart (rules and monitors on), write rules.yaml into `folder`.

    The target labels are the ones the Prometheus Operator gives the targets of the
    ServiceMonitor (job = the Service's name) and the PodMonitor (job = namespace/name)."""
    objects = render(
        helm_binary(), "metrics.prometheusRule.enabled=true", "metrics.serviceMonitor.enabled=true"
    )
    rules_file(objects, folder / "rules.yaml")
    service = find(objects, "Service", **{"rlslice.dev/metrics": "true"})["metadata"]["name"]
    deployment = find(objects, "Deployment", **{"app.kubernetes.io/component": "scheduler"})
    return Chart(
        rules=[r for g in find(objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]],
        scheduler_job=service,
        agent_job=f"{NAMESPACE}/{find(objects, 'PodMonitor')['metadata']['name']}",
        scheduler_labels={
            "namespace": NAMESPACE,
            "service": service,
            "pod": f"{deployment['metadata']['name']}-7d9c5-x2k4q",
            "endpoint": "metrics",
        },
        daemonset=find(objects, "DaemonSet")["metadata"]["name"],
    )


def scrape_config(rendered: Chart, scheduler_port: int, agents: dict[str, int]) -> dict[str, Any]:
    """Scrape the scheduler and the agents (node -> port) every second; evaluate the
    rendered rules as often."""

    def target(port: int, labels: dict[str, str]) -> dict[str, Any]:
        return {"targets": [f"127.0.0.1:{port}"], "labels": labels}

    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [
            {
                "job_name": rendered.scheduler_job,
                "static_configs": [target(scheduler_port, rendered.scheduler_labels)],
            },
            {
                "job_name": rendered.agent_job,
                "static_configs": [
                    target(port, rendered.agent_labels(node)) for node, port in agents.items()
                ],
            },
        ],
    }


def emulated_kubernetes(cluster: kmock.KubernetesEmulator) -> None:
    """The resources the kubernetes store and the Lease elector use."""
    info = kmock.ResourceInfo
    cluster.resources["coordination.k8s.io/v1/leases"] = info(
        kind="Lease", namespaced=True, verbs={"get", "create", "patch", "list"}
    )
    cluster.resources["v1/configmaps"] = info(
        kind="ConfigMap", namespaced=True, verbs={"get", "create", "patch", "list", "delete"}
    )


GROUPS = (
    GroupSpec(
        name="g",
        nodes=("n1",),
        backend="sim",
        headroom_bytes=128 << 20,  # more than the device: a and b never share it
        max_hold_seconds=3.0,
        yield_grace_seconds=1.0,
    ),
    GroupSpec(name="f", nodes=("n2",), backend="sim", headroom_bytes=128 << 20),
)


def agent_settings(folder: Path, node: str, scheduler: str, reserve: int) -> AgentSettings:
    return AgentSettings(
        node=node,
        socket_path=folder / node / "agent.sock",
        state_dir=folder / node / "state",
        host_reserve_bytes=reserve,
        sim=SimSettings(root=folder / node / "sim", capacity_bytes=64 << 20, rate_gbps=0.0),
        scheduler=scheduler,
        metrics_port=0,
    )


async def drive(scheduler: ElectedScheduler, clients: dict[str, AsyncClient]) -> None:
    """In g: a holds, b waits, a yields; a waits, b yields; lock-only c waits, a yields; b
    waits and c, past max_hold_seconds, is preempted (b holds at the end). In f: x holds, y
    waits, x yields, and n2 refuses the snapshot (host memory): the switch fails."""
    running = scheduler.running
    a, b, c, x, y = (clients[job] for job in "abcxy")

    def queue(group: str) -> list[str]:
        return [w.job for w in running.engine.groups[group].state.queue]

    async def hand_over(holder: AsyncClient, to: AsyncClient, phase: str) -> None:
        waiting = asyncio.ensure_future(to.acquire(phase=phase))
        await until(lambda: queue(to.group) == [to.job], f"{to.job} to queue")
        await holder.yield_()
        await asyncio.wait_for(waiting, DEADLINE)

    await a.acquire(phase="rollout")
    await hand_over(a, b, "train")
    await hand_over(b, a, "train")
    await hand_over(a, c, "rollout")
    await asyncio.wait_for(b.acquire(phase="train"), DEADLINE)  # by preemption
    await x.acquire(phase="rollout")
    with pytest.raises(ResourceExhaustedError, match="host memory"):
        await hand_over(x, y, "train")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def live(
    short_dir: Path, job_pids: dict[str, int], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Live]:
    binary = require_tool("prometheus")
    folder = tmp_path_factory.mktemp("prometheus")
    rendered = chart(folder)
    with pytest.MonkeyPatch.context() as env:
        for name in ("RLSLICE_AGENT_SOCKET", "RLSLICE_TOKEN", "RLSLICE_JOB", "RLSLICE_GROUP"):
            env.delenv(name, raising=False)
        async with kmock.KubernetesEmulator() as cluster, kmock.Server(cluster):
            emulated_kubernetes(cluster)
            env.setenv("RLSLICE_KUBE_API", str(cluster.url))
            env.setenv("RLSLICE_NAMESPACE", NAMESPACE)
            settings = SchedulerSettings(
                address="127.0.0.1:0", store="kubernetes:live", groups=GROUPS, metrics_port=0
            )
            api = KubeAPI(str(cluster.url))
            pod = rendered.scheduler_labels["pod"]
            elector = LeaseElector(api, NAMESPACE, "live", pod, duration=60, retry_period=0.2)
            scheduler = ElectedScheduler(settings, elector)
            await scheduler.start()
            agents: dict[str, RunningAgent] = {}
            prometheus = None
            clients = {
                job: AsyncClient(
                    job=job, group=group, scheduler=scheduler.address, lease_seconds=600
                )
                for job, group in (("a", "g"), ("b", "g"), ("c", "g"), ("x", "f"), ("y", "f"))
            }
            try:
                await until(lambda: scheduler.leading, "the scheduler to lead")
                # n2 keeps all host memory in reserve: it refuses every snapshot.
                for node, reserve in (("n1", 0), ("n2", 1 << 55)):
                    settings_of = agent_settings(short_dir, node, scheduler.address, reserve)
                    agents[node] = await start_agent(settings_of)
                assert scheduler.metrics_port is not None
                ports = {node: agent.metrics_port for node, agent in agents.items()}
                assert None not in ports.values()
                config = scrape_config(rendered, scheduler.metrics_port, ports)  # type: ignore[arg-type]
                prometheus = Prometheus.start(binary, config, folder)
                await asyncio.to_thread(prometheus.wait_ready, DEADLINE)
                known = scheduler.running.coordinator.agents
                await until(lambda: {"n1", "n2"} <= set(known), "agents n1 and n2")
                for job, pid in job_pids.items():
                    ref = identify(pid)
                    assert ref is not None
                    node, group = ("n1", "g") if job in "ab" else ("n2", "f")
                    agents[node].engine.register(ref, job, group)
                await drive(scheduler, clients)
                yield Live(prometheus, rendered)
            finally:
                for client in clients.values():
                    await client.close()
                if prometheus is not None:
                    prometheus.stop()
                for agent in agents.values():
                    await agent.stop(0)
                await scheduler.stop()


async def test_prometheus_scrapes_every_target_with_the_chart_labels(live: Live) -> None:
    def all_up() -> list[dict[str, Any]] | None:
        targets = live.prometheus.api("targets")["activeTargets"]
        healthy = [t for t in targets if t["health"] == "up"]
        return targets if len(healthy) == len(targets) == 3 else None

    targets = await asyncio.to_thread(poll, all_up, DEADLINE, "the three targets up")
    by_pod = {t["labels"]["pod"]: t["labels"] for t in targets}
    expected = [live.chart.scheduler_labels, *map(live.chart.agent_labels, ("n1", "n2"))]
    for labels in expected:
        assert by_pod[labels["pod"]].items() >= labels.items()


def check_labels(answers: dict[Query, list[dict[str, Any]]]) -> None:
    for query, series in answers.items():
        for one in series:
            missing = query.labels - {k for k, v in one["metric"].items() if v}
            assert not missing, f"{query.source}: series {one['metric']} lacks {missing}"


async def test_every_dashboard_query_returns_series_with_its_legend_labels(live: Live) -> None:
    queries = dashboard_queries()
    assert len(queries) > 20
    answers = await live.answers(queries)
    check_labels(answers)
    holders = answers[next(q for q in queries if "rlslice_scheduler_holder" in q.expr)]
    # The metric's own `job` label clashes with the target's: Prometheus keeps it as
    # exported_job, which the panel shows.
    assert [s["metric"]["exported_job"] for s in holders] == ["b"]
    nodes = {
        s["metric"]["node"] for q in queries if "group_left (node)" in q.expr for s in answers[q]
    }
    assert nodes == {"n1", "n2"}


async def test_every_rule_query_returns_series_with_the_labels_its_alert_uses(
    live: Live,
) -> None:
    queries = rule_queries(live.chart.rules)
    assert {q.source for q in queries} >= {"RlsliceNoLeader", "RlsliceJobFaulted"}
    answers = await live.answers(queries)
    check_labels(answers)
    faulted = answers[next(q for q in queries if q.source == "RlsliceJobFaulted")]
    pods = sorted(live.chart.agent_labels(node)["pod"] for node in ("n1", "n2"))
    assert sorted(s["metric"]["pod"] for s in faulted) == pods
    failures = answers[next(q for q in queries if q.source == "RlsliceSwitchFailures")]
    assert [s["metric"]["group"] for s in failures] == ["f"]
    # The failed series is younger than the window: the alert counts all of it (the
    # scheduler retries a failed switch before the waiter's acquire fails), at one instant.
    rule = next(q for q in queries if q.source == "RlsliceSwitchFailures")
    at = time.time()
    counted, raw = await asyncio.gather(
        asyncio.to_thread(live.prometheus.query, rule.expr, at),
        asyncio.to_thread(
            live.prometheus.query, 'rlslice_scheduler_switches_total{outcome="failed"}', at
        ),
    )
    assert [s["metric"]["group"] for s in raw] == ["f"]
    assert float(counted[0]["value"][1]) == float(raw[0]["value"][1]) >= 1


async def test_every_selector_of_the_dashboard_and_the_rules_finds_series(live: Live) -> None:
    queries = selectors(dashboard_queries() + rule_queries(live.chart.rules))
    names = {SERIES.match(q.expr).group(1) for q in queries}  # type: ignore[union-attr]
    assert "rlslice_scheduler_leader" in names
    answers = await live.answers(queries)
    assert all(answers[q] for q in queries if not q.exemption())


async def test_the_rules_evaluate_cleanly_and_only_the_failed_switch_alerts(
    live: Live,
) -> None:
    def evaluated() -> list[dict[str, Any]] | None:
        groups = live.prometheus.api("rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        done = all(not r["lastEvaluation"].startswith("0001-") for r in rules)
        return rules if rules and done else None

    rules = await asyncio.to_thread(poll, evaluated, DEADLINE, "every rule evaluated")
    assert {r["name"] for r in rules} == {r["alert"] for r in live.chart.rules}
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
    # Group f's one failed switch (its series created at 1) fires at once; nothing else
    # may stay (RlsliceNoLeader is pending until the first scrape, then must clear).
    expected = [("RlsliceSwitchFailures", "f", "firing")]
    last: list[tuple[str, str, str]] = []

    def settled() -> bool | None:
        alerts = live.prometheus.api("alerts")["alerts"]
        last[:] = sorted(
            (a["labels"]["alertname"], a["labels"].get("group", ""), a["state"]) for a in alerts
        )
        return True if last == expected else None

    try:
        await asyncio.to_thread(poll, settled, DEADLINE, "the failed switch's alert alone")
    except AssertionError:
        raise AssertionError(f"alerts {last}, expected {expected}") from None


async def test_exempt_series_name_metrics_that_are_in_the_scrape(live: Live) -> None:
    queries = dashboard_queries() + rule_queries(live.chart.rules)
    for exemption in EXEMPT:
        assert exemption.reason
        assert any(q.exemption() is exemption for q in queries), f"unused: {exemption}"

    def scraped() -> set[str] | None:
        names = set(live.prometheus.api("label/__name__/values"))
        return names if {e.metric for e in EXEMPT} <= names else None

    await asyncio.to_thread(poll, scraped, DEADLINE, "the exempt metrics in the scrape")
    metadata = await asyncio.to_thread(live.prometheus.api, "metadata")
    for exemption in EXEMPT:
        family = exemption.metric.removesuffix("_total")
        assert family in metadata or exemption.metric in metadata, exemption.metric
