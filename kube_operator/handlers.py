"""The kopf handlers for TimeSliceGroup resources and the pod-mutation webhook.

`build_registry(config)` returns a fresh kopf registry (nothing global), so the command and
the tests run the same handlers: create/update/resume put the group into the scheduler,
a timer syncs status (and repairs drift after a scheduler restart), deletion runs behind
our finalizer, and a mutating webhook injects the `RLSLICE_*` environment into labelled pods.
The decisions are the pure functions of `reconcile` and `mutation`; this module only calls.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast

import jsonpatch
import kopf
from kopf._cogs.structs.reviews import Request as AdmissionRequest  # kopf exports no name
from kopf._cogs.structs.reviews import Response as AdmissionResponse

from rlslice._errors import FailedPreconditionError, InvalidArgumentError, RlsliceError
from rlslice.adapters.kube import KubeAPI
from rlslice.config import GroupSpec
from rlslice.operator.access import admission_refusal, needs_namespace_labels
from rlslice.operator.mutation import GROUP_LABEL, mutate
from rlslice.operator.namespaces import NamespaceLabels
from rlslice.operator.reconcile import (
    DeleteGroupAction,
    PutGroupAction,
    RetryLater,
    SchedulerView,
    finalize,
    reconcile,
    status_for,
)
from rlslice.operator.scheduler_api import SchedulerAPI
from rlslice.operator.settings import OperatorConfig
from rlslice.operator.spec import GROUP, PLURAL, VERSION, group_spec

#: Our domain for kopf's bookkeeping: the finalizer and the annotations it keeps.
DOMAIN = "rlslice.dev"
FINALIZER = f"{DOMAIN}/finalizer"
#: The webhook's handler id, which is also the URL path the webhook configuration names.
WEBHOOK_ID = "inject"

log = logging.getLogger(__name__)


class NamespacedWebhookServer(kopf.WebhookServer):
    """kopf's webhook server, with the review's namespace copied into an object that names
    none (the API server may send a pod being created without `metadata.namespace`; the
    access rule needs it). kopf diffs against the object it was given, so the copy is never
    part of the patch."""

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async def with_namespace(
            request: AdmissionRequest,
            *,
            webhook: str | None = None,
            headers: dict[str, str] | None = None,
            sslpeer: dict[str, Any] | None = None,
        ) -> AdmissionResponse:
            review = cast(dict[str, Any], request.get("request", {}))
            obj = review.get("object")
            namespace = review.get("namespace")
            if isinstance(obj, dict) and namespace:
                meta = obj.setdefault("metadata", {})
                if not meta.get("namespace"):
                    meta["namespace"] = namespace
            return await fn(request, webhook=webhook, headers=headers, sslpeer=sslpeer)

        async for client_config in super().__call__(with_namespace):
            yield client_config


def operator_settings(config: OperatorConfig) -> kopf.OperatorSettings:
    """kopf settings: our finalizer, progress and diff-base in `rlslice.dev` annotations,
    events only for warnings (the status timer would otherwise post one per sync)."""
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=DOMAIN)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=DOMAIN, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.peering.standalone = True  # one replica, Recreate: no peering resources needed
    settings.admission.managed = None  # the chart owns the MutatingWebhookConfiguration
    if config.admits and config.webhook is not None:
        settings.admission.server = NamespacedWebhookServer(
            addr=config.webhook.addr,
            port=config.webhook.port,
            certfile=str(config.webhook.certfile) if config.webhook.certfile else None,
            pkeyfile=str(config.webhook.keyfile) if config.webhook.keyfile else None,
            insecure=config.webhook.insecure,
        )
    return settings


def build_registry(
    config: OperatorConfig, registry: kopf.OperatorRegistry | None = None
) -> kopf.OperatorRegistry:
    """A registry with the handlers of `config.role`, bound to `config`: the controller's
    (put, status timer, delete behind the finalizer) and/or the webhook's (the groups index
    and the pod mutation).

    It has no login handler: add `login_in_cluster` for a real cluster, or your own (the
    tests log in to an emulated API server).
    """
    registry = registry if registry is not None else kopf.OperatorRegistry()
    if config.reconciles:
        _register_controller(config, registry)
    if config.admits:
        _register_webhook(config, registry)
    return registry


RESOURCE = (GROUP, VERSION, PLURAL)


def _register_controller(config: OperatorConfig, registry: kopf.OperatorRegistry) -> None:
    """The TimeSliceGroup handlers: put on create/update/resume, the status timer, and the
    deletion behind the finalizer; one scheduler channel per operator run."""
    api_holder: dict[str, SchedulerAPI] = {}

    def api() -> SchedulerAPI:
        # One channel per operator run, opened inside its event loop.
        if "api" not in api_holder:
            api_holder["api"] = SchedulerAPI(
                config.scheduler_address,
                tls=config.tls,
                token=config.admin_token,
                timeout=config.rpc_timeout,
            )
        return api_holder["api"]

    @kopf.on.cleanup(registry=registry)
    async def close_channel(**_: Any) -> None:
        if "api" in api_holder:
            await api_holder.pop("api").close()

    @kopf.on.resume(*RESOURCE, id="put-group", registry=registry)
    @kopf.on.create(*RESOURCE, id="put-group", registry=registry)
    @kopf.on.update(*RESOURCE, id="put-group", field="spec", registry=registry)
    async def put_group(
        name: str, spec: kopf.Spec, body: kopf.Body, patch: kopf.Patch, **_: Any
    ) -> None:
        await _sync(api(), name, spec, body, patch, timer=False)

    @kopf.timer(*RESOURCE, id="sync-status", interval=config.status_interval, registry=registry)
    async def sync_status(
        name: str, spec: kopf.Spec, body: kopf.Body, patch: kopf.Patch, **_: Any
    ) -> None:
        if body.metadata.get("deletionTimestamp"):
            return
        await _sync(api(), name, spec, body, patch, timer=True)

    @kopf.on.delete(*RESOURCE, id="delete-group", registry=registry)
    async def delete_group(name: str, body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        await _delete(api(), config, name, body, patch)


async def _delete(
    client: SchedulerAPI, config: OperatorConfig, name: str, body: kopf.Body, patch: kopf.Patch
) -> None:
    """One pass of a group's deletion: what `finalize` says, against the scheduler."""
    try:
        observed = await client.get(name)
    except RlsliceError as error:
        raise kopf.TemporaryError(f"scheduler: {error}", delay=5) from None
    waited = _seconds_since(body.metadata.get("deletionTimestamp"))
    actions = finalize(
        name,
        observed,
        waited_seconds=waited,
        timeout_seconds=config.delete_timeout,
        poll_seconds=config.status_interval,
    )
    patch.status["phase"] = "Deleting"
    for action in actions:
        if isinstance(action, RetryLater):
            raise kopf.TemporaryError(action.reason, delay=action.delay)
        if isinstance(action, DeleteGroupAction):
            try:
                await client.delete(action.name, force=action.force)
            except FailedPreconditionError as error:  # a job took the lock meanwhile
                raise kopf.TemporaryError(f"scheduler: {error}", delay=1) from None
            except RlsliceError as error:
                raise kopf.TemporaryError(f"scheduler: {error}", delay=5) from None
            if action.force:
                log.warning("group %s: deletion forced after %.0fs", name, waited)


def _register_webhook(config: OperatorConfig, registry: kopf.OperatorRegistry) -> None:
    """The webhook's handlers: the groups index and the pod mutation; one namespace-label
    reader per operator run."""

    @kopf.index(*RESOURCE, id="groups", registry=registry)
    def groups(name: str, body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
        # Read by the webhook: the group a pod names, without an API call per admission.
        return {name: {"spec": dict(body.get("spec") or {})}}

    labels_holder: dict[str, NamespaceLabels] = {}

    def namespace_labels() -> NamespaceLabels:
        # Opened inside the operator's event loop, at the first selector to check.
        if "labels" not in labels_holder:
            labels_holder["labels"] = NamespaceLabels(KubeAPI.from_environment())
        return labels_holder["labels"]

    @kopf.on.cleanup(registry=registry)
    async def close_namespace_labels(**_: Any) -> None:
        if "labels" in labels_holder:
            await labels_holder.pop("labels").close()

    @kopf.on.mutate(
        "v1",
        "pods",
        id=WEBHOOK_ID,
        operation="CREATE",
        labels={GROUP_LABEL: kopf.PRESENT},
        registry=registry,
    )
    async def inject(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
        groups: kopf.Index[str, Any] = kwargs["groups"]  # the index above, by its name
        await _inject(config, groups, body, patch, namespace_labels)


async def _inject(
    config: OperatorConfig,
    groups: kopf.Index[str, Any],
    body: kopf.Body,
    patch: kopf.Patch,
    namespace_labels: Callable[[], NamespaceLabels],
) -> None:
    """Admit a labelled pod, or refuse it, and patch the `RLSLICE_*` environment in."""
    # The webhook configuration's namespaceSelector keeps system namespaces out; the
    # pure function skips them again when the object names its namespace.
    name = (body.metadata.labels or {}).get(GROUP_LABEL, "")
    group = next(iter(groups.get(name, [])), None)
    namespace = str(body.metadata.namespace or "")
    if namespace in config.injection.skip_namespaces:
        return
    labels = None
    if needs_namespace_labels(group, namespace):
        labels = await namespace_labels().get(namespace)
    refusal = admission_refusal(name, group, namespace, labels)
    if refusal is not None:
        raise kopf.AdmissionError(refusal, code=403)
    ops = mutate(dict(body), group, config.injection)
    if ops:
        # kopf diffs the transformed body against the original into the response's
        # JSON patch, so the effect is exactly these operations.
        patch.fns.append(lambda raw: jsonpatch.apply_patch(raw, ops, in_place=True))


def login_in_cluster(registry: kopf.OperatorRegistry) -> None:
    """Log in with the pod's service account, else the local kubeconfig (no client library)."""

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        info = kopf.login_with_service_account(**kwargs)
        return info if info is not None else kopf.login_with_kubeconfig(**kwargs)


async def _sync(
    client: SchedulerAPI,
    name: str,
    spec: Mapping[str, Any],
    body: kopf.Body,
    patch: kopf.Patch,
    *,
    timer: bool,
) -> None:
    """Reconcile one group into the scheduler and write its status (both handlers).

    The timer stays quiet about an invalid spec (the change handler already failed it
    permanently, and a timer error would post an event every interval); a scheduler
    outage is a retry for both.
    """
    generation = int(body.metadata.get("generation") or 0)
    previous = dict(body.get("status") or {})
    now = _now()
    try:
        desired: GroupSpec = group_spec(name, spec)
    except InvalidArgumentError as error:
        status = status_for(
            None, None, generation=generation, now=now, previous=previous, invalid=str(error)
        )
        _patch_status(patch, previous, status)
        if timer:
            return
        raise kopf.PermanentError(str(error)) from None
    observed: SchedulerView | None
    try:
        observed = await client.get(name)
        for action in reconcile(desired, observed):
            if isinstance(action, PutGroupAction):
                observed = await client.put(action.spec)
    except RlsliceError as error:
        message = f"scheduler: {error}"
        status = status_for(
            desired, None, generation=generation, now=now, previous=previous, error=message
        )
        _patch_status(patch, previous, status)
        raise kopf.TemporaryError(message, delay=5) from None
    status = status_for(desired, observed, generation=generation, now=now, previous=previous)
    _patch_status(patch, previous, status)


def _patch_status(
    patch: kopf.Patch, previous: Mapping[str, Any], status: Mapping[str, Any]
) -> None:
    """Only the fields that changed: an idle group costs the API server no writes."""
    for key, value in status.items():
        if previous.get(key) != value:
            patch.status[key] = value


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _seconds_since(timestamp: object) -> float:
    if not isinstance(timestamp, str) or not timestamp:
        return 0.0
    try:
        then = datetime.datetime.fromisoformat(timestamp)
    except ValueError:
        return 0.0
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.UTC)
    return max(0.0, (datetime.datetime.now(datetime.UTC) - then).total_seconds())
