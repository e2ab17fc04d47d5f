"""Namespace labels for the webhook's access rule (a TimeSliceGroup's namespaceSelector),
read from the API server and kept for a short while.

Only asked when a group has a namespaceSelector and the pod's namespace is not listed by
name, so most admissions make no API call. A namespace whose labels cannot be read is
reported as None: the webhook then refuses the pod (fail closed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rlslice.adapters.kube import KubeAPI, KubeError

log = logging.getLogger(__name__)


class NamespaceLabels:
    """Labels of namespaces by name, each kept `ttl` seconds after it was read."""

    def __init__(
        self, api: KubeAPI, *, ttl: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.api = api
        self.ttl = ttl
        self._clock = clock
        self._seen: dict[str, tuple[float, dict[str, str]]] = {}

    async def get(self, name: str) -> dict[str, str] | None:
        """The labels of namespace `name`; None when they cannot be read."""
        now = self._clock()
        kept = self._seen.get(name)
        if kept is not None and now - kept[0] < self.ttl:
            return kept[1]
        try:
            namespace = await self.api.request("GET", f"/api/v1/namespaces/{name}")
        except KubeError as error:
            log.warning("namespace %s: cannot read its labels: %s", name, error)
            return None
        labels = {
            str(k): str(v)
            for k, v in ((namespace.get("metadata") or {}).get("labels") or {}).items()
        }
        self._seen[name] = (now, labels)
        return labels

    async def close(self) -> None:
        """Close the API client."""
        await self.api.close()
