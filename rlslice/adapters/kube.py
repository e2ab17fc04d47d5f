"""Just enough of the Kubernetes REST API for the scheduler and the agent: JSON in, JSON out,
list-then-watch streams, one aiohttp session, the pod's service account.

Shared kernel: the scheduler's store and leader election and the agent's Kubernetes mode
use it (components meet only through `rlslice`), so neither needs the `kubernetes` client
package. aiohttp is imported when the first request is made (`rlslice[operator]` or
`rlslice[all]` installs it).
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(Exception):
    """A Kubernetes API call failed; `status` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"kubernetes API: HTTP {status}: {message}"[:500])
        self.status = status


class KubeAPI:
    """A small client of the Kubernetes API server."""

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        ca_file: Path | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.server = server.rstrip("/")
        self._token = token
        self._ca_file = ca_file
        self._timeout = timeout
        self._session: Any = None

    @classmethod
    def in_cluster(cls, *, timeout: float = 10.0) -> KubeAPI:
        """The API server as a pod sees it (`RLSLICE_KUBE_API` overrides, for tests)."""
        server = os.environ.get("RLSLICE_KUBE_API")
        if not server:
            host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if ":" in host:  # an IPv6 literal
                host = f"[{host}]"
            server = f"https://{host}:{port}"
        token_file = SERVICE_ACCOUNT / "token"
        ca_file = SERVICE_ACCOUNT / "ca.crt"
        return cls(
            server,
            token=token_file.read_text().strip() if token_file.exists() else None,
            ca_file=ca_file if ca_file.exists() else None,
            timeout=timeout,
        )

    def _open(self) -> Any:
        import aiohttp

        if self._session is None:
            context = ssl.create_default_context(
                cafile=str(self._ca_file) if self._ca_file else None
            )
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=context),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
        return self._session

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    async def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> dict[str, Any]:
        """The decoded answer; raises KubeError for any status but 2xx."""
        import aiohttp

        session = self._open()
        headers = self._headers()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        try:
            async with session.request(
                method, self.server + path, data=data, headers=headers
            ) as response:
                text = await response.text()
                if response.status // 100 != 2:
                    raise KubeError(response.status, text)
                return json.loads(text) if text else {}
        except (aiohttp.ClientError, TimeoutError) as error:
            raise KubeError(0, str(error) or type(error).__name__) from None

    async def watch(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        *,
        resource_version: str = "",
        timeout_seconds: int = 300,
    ) -> AsyncIterator[dict[str, Any]]:
        """The events (`{"type": ..., "object": ...}`) of a watch on the list at `path`.

        Ends when the server ends the stream (it does after `timeout_seconds`) or nothing
        arrives for that long plus a margin; the caller lists again and re-watches. A
        410 Gone (the resource version is too old) raises KubeError(410).
        """
        import aiohttp

        session = self._open()
        query = dict(params or {})
        query.update(watch="true", timeoutSeconds=str(timeout_seconds))
        query["allowWatchBookmarks"] = "true"
        if resource_version:
            query["resourceVersion"] = resource_version
        url = f"{self.server}{path}?{urllib.parse.urlencode(query)}"
        timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30)
        try:
            async with session.get(url, headers=self._headers(), timeout=timeout) as response:
                if response.status // 100 != 2:
                    raise KubeError(response.status, await response.text())
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise KubeError(int(status.get("code") or 500), str(status.get("message")))
                    yield event
        except (aiohttp.ClientError, TimeoutError) as error:
            raise KubeError(0, str(error) or type(error).__name__) from None

    async def close(self) -> None:
        """Close the session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def namespace_in_cluster() -> str:
    """This pod's namespace (`RLSLICE_NAMESPACE` overrides)."""
    explicit = os.environ.get("RLSLICE_NAMESPACE")
    if explicit:
        return explicit
    file = SERVICE_ACCOUNT / "namespace"
    return file.read_text().strip() if file.exists() else "default"
