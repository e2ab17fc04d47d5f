"""How tests/deploy/image run each component: the chart's command, user, capabilities, mounts and
env, with the few differences a container on a test machine needs, each named here with
its reason. test_chart_parity.py renders the chart and holds these specs to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: the chart's args of every component container (`command: [rlslice]`)
ARGS = {
    "scheduler": ("--log-level", "INFO", "scheduler"),
    "agent": ("--log-level", "INFO", "agent"),
    "operator": ("--log-level", "INFO", "operator"),
    "webhook": ("--log-level", "INFO", "operator"),
}
TOKENS = {"job": "job-token-image-test", "admin": "admin-token-image-test", "agent": "agt-image"}


@dataclass(frozen=True)
class Component:
    """One chart container as tests/deploy/image run it."""

    deployment: str  # the chart's workload name suffix (rls-<deployment>)
    user: int
    env: dict[str, str]
    tmpfs: tuple[str, ...] = ()
    host_pid: bool = False
    capabilities: tuple[str, ...] = ()
    #: chart env names the test leaves out -> why
    env_left_out: dict[str, str] = field(default_factory=dict)
    #: env names the test adds -> why
    env_added: dict[str, str] = field(default_factory=dict)
    #: chart env whose value the test changes -> why
    env_changed: dict[str, str] = field(default_factory=dict)
    #: capabilities the test adds beyond the chart's -> why
    capabilities_added: dict[str, str] = field(default_factory=dict)

    @property
    def args(self) -> tuple[str, ...]:
        return ARGS[self.deployment]

    def flags(self, podman: bool) -> list[str]:
        """`run` flags for user, read-only root, capabilities, tmpfs, PID namespace, env."""
        flags = ["--user", f"{self.user}:{self.user}", "--read-only"]
        if podman:
            flags.append("--read-only-tmpfs=false")  # no tmpfs the chart does not mount
        flags += ["--cap-drop=ALL", "--security-opt=no-new-privileges"]
        flags += [f"--cap-add={cap}" for cap in (*self.capabilities, *self.capabilities_added)]
        flags += [item for path in self.tmpfs for item in ("--tmpfs", path)]
        flags += ["--pid=host"] if self.host_pid else []
        flags += [item for key, value in self.env.items() for item in ("-e", f"{key}={value}")]
        return flags


LOOPBACK = "the chart listens on 0.0.0.0 in the pod; here only 127.0.0.1 of the host network"
PORT = "a free port of the host network"


def scheduler(address: str, metrics_port: int) -> Component:
    return Component(
        deployment="scheduler",
        user=65532,
        env={
            "RLSLICE_SCHEDULER_ADDRESS": address,
            "RLSLICE_STORE": "/var/lib/rlslice/scheduler.db",
            "RLSLICE_GROUP_CONFIG": "/etc/rlslice/groups.yaml",
            "RLSLICE_METRICS_PORT": str(metrics_port),
            "RLSLICE_METRICS_ADDRESS": "127.0.0.1",
            "RLSLICE_JOB_TOKEN": TOKENS["job"],
            "RLSLICE_ADMIN_TOKEN": TOKENS["admin"],
            "RLSLICE_AGENT_TOKEN": TOKENS["agent"],
        },
        env_added={
            "RLSLICE_GROUP_CONFIG": "the round's group; the operator puts groups in a cluster"
        },
        env_changed={
            "RLSLICE_SCHEDULER_ADDRESS": LOOPBACK,
            "RLSLICE_METRICS_ADDRESS": LOOPBACK,
            "RLSLICE_METRICS_PORT": PORT,
        },
    )


def agent(address: str, scheduler_address: str, metrics_port: int, node: str) -> Component:
    return Component(
        deployment="agent",
        user=0,
        host_pid=True,
        # The chart adds DAC_OVERRIDE with the sim backend: it opens the jobs' buffer files
        # (0600, the job's uid).
        capabilities=("SYS_PTRACE", "KILL", "DAC_OVERRIDE"),
        tmpfs=("/tmp",),
        env={
            "RLSLICE_AGENT_NODE": node,
            "RLSLICE_AGENT_PROC_ROOT": "/host/proc",
            "RLSLICE_AGENT_ADDRESS": address,
            "RLSLICE_AGENT_SOCKET": "/run/rlslice/agent.sock",
            "RLSLICE_AGENT_SOCKET_MODE": "666",
            "RLSLICE_AGENT_STATE_DIR": "/var/lib/rlslice/agent",
            "RLSLICE_AGENT_BACKEND": "sim",
            "RLSLICE_AGENT_SIM_ROOT": "/run/rlslice/sim",
            "RLSLICE_AGENT_HOST_RESERVE": "0",
            "RLSLICE_AGENT_SCHEDULER": scheduler_address,
            "RLSLICE_AGENT_METRICS_PORT": str(metrics_port),
            "RLSLICE_AGENT_TOKEN": TOKENS["agent"],
        },
        env_left_out={
            "RLSLICE_AGENT_KUBERNETES": "standalone: the jobs register through the socket",
            "NODE_NAME": "Kubernetes mode only (RLSLICE_AGENT_NODE instead)",
            "POD_IP": "Kubernetes mode only",
            "RLSLICE_AGENT_ADVERTISE_ADDRESS": "the bound loopback address is dialable",
            "NVIDIA_VISIBLE_DEVICES": "no GPU: the sim backend",
            "NVIDIA_DRIVER_CAPABILITIES": "no GPU: the sim backend",
        },
        env_added={"RLSLICE_AGENT_NODE": "standalone node name (Kubernetes mode: NODE_NAME)"},
        env_changed={
            "RLSLICE_AGENT_ADDRESS": LOOPBACK,
            "RLSLICE_AGENT_SCHEDULER": "the scheduler container's loopback address",
            "RLSLICE_AGENT_METRICS_PORT": PORT,
            "RLSLICE_AGENT_HOST_RESERVE": "a CI machine has little memory to keep free",
        },
    )


KUBECONFIG = {"KUBECONFIG": "the emulator on the host's loopback instead of a service account"}


def webhook(namespace: str) -> Component:
    return Component(
        deployment="webhook",
        user=65532,
        tmpfs=("/tmp",),
        env={
            "RLSLICE_OPERATOR_ROLE": "webhook",
            "RLSLICE_OPERATOR_SCHEDULER": f"rls-scheduler.{namespace}.svc:50551",
            "RLSLICE_OPERATOR_HEALTH_PORT": "8080",
            "RLSLICE_OPERATOR_WEBHOOK_PORT": "9443",
            "RLSLICE_OPERATOR_WEBHOOK_CERT": "/etc/rlslice/webhook/tls.crt",
            "RLSLICE_OPERATOR_WEBHOOK_KEY": "/etc/rlslice/webhook/tls.key",
            "RLSLICE_OPERATOR_AGENT_SOCKET_DIR": "/run/rlslice",
            "RLSLICE_OPERATOR_SIM_ROOT": "/run/rlslice/sim",
            "RLSLICE_OPERATOR_GPU_TOLERATION_KEY": "nvidia.com/gpu",
            "RLSLICE_OPERATOR_SKIP_NAMESPACES": namespace,
            "RLSLICE_OPERATOR_JOB_TOKEN_SECRET": "rlslice-job-token",
            "KUBECONFIG": "/etc/kube/config",
        },
        env_added=KUBECONFIG,
    )


def controller(namespace: str) -> Component:
    return Component(
        deployment="operator",
        user=65532,
        tmpfs=("/tmp",),
        env={
            "RLSLICE_OPERATOR_ROLE": "controller",
            "RLSLICE_NAMESPACE": namespace,
            "RLSLICE_OPERATOR_SCHEDULER": "10.0.2.2:1",
            "RLSLICE_OPERATOR_STATUS_INTERVAL": "10",
            "RLSLICE_OPERATOR_DELETE_TIMEOUT": "300",
            "RLSLICE_OPERATOR_HEALTH_PORT": "8080",
            "RLSLICE_OPERATOR_WEBHOOK_PORT": "0",
            "RLSLICE_OPERATOR_WEBHOOK_TLS_SECRET": "rls-webhook-tls",
            "RLSLICE_OPERATOR_WEBHOOK_NAMES": (
                f"rls-webhook,rls-webhook.{namespace},rls-webhook.{namespace}.svc"
            ),
            "RLSLICE_OPERATOR_WEBHOOK_CONFIGURATION": "rls-webhook",
            "RLSLICE_OPERATOR_TOKENS_SECRET": "rls-tokens",
            "RLSLICE_OPERATOR_JOB_TOKEN_SECRET": "rlslice-job-token",
            "KUBECONFIG": "/etc/kube/config",
        },
        env_added=KUBECONFIG,
        env_changed={
            "RLSLICE_OPERATOR_SCHEDULER": "no scheduler: a refused port on the host's loopback"
        },
    )
