"""The Kubernetes API for the scheduler and the agent, through `kubernetes_asyncio` (the
maintained async port of the official client): its configuration loading, authentication,
TLS and aiohttp transport; JSON in, JSON out, list-then-watch streams.

Shared kernel: the scheduler's store and leader election and the agent's Kubernetes mode
use it (components meet only through `rlslice`). They work on plain JSON objects (the pure
rules read and write dicts), so `KubeAPI` sends requests through the client's `ApiClient`
by path instead of the generated model classes.

Where the configuration comes from:

- `KubeAPI.in_cluster()`: the pod's service account. The token is re-read whenever the
  file changes (the kubelet rotates projected tokens; EKS refuses tokens older than 90
  days), so the next request after a rotation carries the new token.
- `KubeAPI.from_kubeconfig(path, context)`: a kubeconfig (contexts, client certificates,
  exec plugins such as `aws eks get-token` or `gke-gcloud-auth-plugin`; an exec plugin's
  credential is fetched again when it expires).
- `KubeAPI.from_environment()`: in-cluster inside a pod, the kubeconfig (`KUBECONFIG` or
  `~/.kube/config`) elsewhere.

`kubernetes_asyncio` is imported at the first request (`rlslice[scheduler]`,
`rlslice[agent]` or `rlslice[all]` installs it).
"""

from __future__ import annotations

import datetime
import json
import os
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

Configure = Callable[[Any], Awaitable[None]]
"""Fills a `kubernetes_asyncio.client.Configuration` (host, credentials, TLS)."""


class KubeError(Exception):
    """A Kubernetes API call failed; `status` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"kubernetes API: HTTP {status}: {message}"[:500])
        self.status = status
        self.retry_after = retry_after
        """Seconds the server asked to wait (429, 503: its Retry-After), else None."""


class TokenFile:
    """A bearer token read from a file again whenever the file changes (rotation)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._token = ""

    def current(self) -> str:
        """The token as the file holds it now ("" when the file is missing)."""
        try:
            stat = self.path.stat()  # follows the kubelet's ..data symlink swap
        except FileNotFoundError:
            return ""
        seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if seen != self._seen:
            self._token = self.path.read_text().strip()
            self._seen = seen
        return self._token


def _token_hook(token_file: TokenFile) -> Callable[[Any], None]:
    def refresh(configuration: Any) -> None:
        token = token_file.current()
        if token:
            configuration.api_key["BearerToken"] = f"Bearer {token}"
        else:
            configuration.api_key.pop("BearerToken", None)

    return refresh


class KubeAPI:
    """A client of the Kubernetes API server (one `kubernetes_asyncio` ApiClient)."""

    def __init__(
        self,
        server: str | None = None,
        *,
        token: str | None = None,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        configure: Configure | None = None,
        timeout: float = 10.0,
    ) -> None:
        """Talk to `server` with a fixed `token` or one read from `token_file` (re-read on
        change), or let `configure` fill the client configuration (kubeconfig loading)."""
        self.server = server.rstrip("/") if server else ""
        self._token = token
        self._token_file = TokenFile(token_file) if token_file else None
        self._ca_file = ca_file
        self._configure = configure
        self._timeout = timeout
        self._client: Any = None

    @classmethod
    def in_cluster(
        cls, *, timeout: float = 10.0, service_account: Path = SERVICE_ACCOUNT
    ) -> KubeAPI:
        """The API server as a pod sees it (`RLSLICE_KUBE_API` overrides the address,
        for tests), authenticated with the service account's rotating token."""
        server = os.environ.get("RLSLICE_KUBE_API")
        if not server:
            host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if ":" in host:  # an IPv6 literal
                host = f"[{host}]"
            server = f"https://{host}:{port}"
        ca_file = service_account / "ca.crt"
        return cls(
            server,
            token_file=service_account / "token",
            ca_file=ca_file if ca_file.exists() else None,
            timeout=timeout,
        )

    @classmethod
    def from_kubeconfig(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        context: str | None = None,
        timeout: float = 10.0,
    ) -> KubeAPI:
        """The cluster of `context` (default: the current one) in the kubeconfig at `path`
        (default: the files in `KUBECONFIG`, merged, else `~/.kube/config`). Read at the first
        request; an exec plugin's credential is fetched again once it expires."""

        async def configure(configuration: Any) -> None:
            from kubernetes_asyncio import config

            loader = await config.load_kube_config(
                # None: the library merges every file in KUBECONFIG, else ~/.kube/config.
                config_file=os.fspath(path) if path is not None else None,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )

            async def refresh(configuration: Any) -> None:
                expiry = getattr(loader, "exec_plugin_expiry", None)
                if expiry is not None and _expired(expiry):
                    await loader.load_and_set(configuration)

            configuration.refresh_api_key_hook = refresh

        return cls(configure=configure, timeout=timeout)

    @classmethod
    def from_environment(cls, *, timeout: float = 10.0) -> KubeAPI:
        """In-cluster inside a pod (or with `RLSLICE_KUBE_API`), else the kubeconfig."""
        inside = os.environ.get("KUBERNETES_SERVICE_HOST") or (SERVICE_ACCOUNT / "token").exists()
        if inside or os.environ.get("RLSLICE_KUBE_API"):
            return cls.in_cluster(timeout=timeout)
        return cls.from_kubeconfig(timeout=timeout)

    async def _api_client(self) -> Any:
        if self._client is None:
            from kubernetes_asyncio.client import ApiClient, Configuration

            configuration = Configuration()
            if self._configure is not None:
                await self._configure(configuration)
                self.server = str(configuration.host).rstrip("/")
            else:
                configuration.host = self.server
                if self._ca_file is not None:
                    configuration.ssl_ca_cert = str(self._ca_file)
                if self._token:
                    configuration.api_key["BearerToken"] = f"Bearer {self._token}"
                if self._token_file is not None:
                    configuration.refresh_api_key_hook = _token_hook(self._token_file)
                    _token_hook(self._token_file)(configuration)
            self._client = ApiClient(configuration)
        return self._client

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: Any = None,
    ) -> Any:
        """The raw aiohttp response (the caller reads and releases it)."""
        client = await self._api_client()
        split = urllib.parse.urlsplit(path)
        query = [*urllib.parse.parse_qsl(split.query), *(params or {}).items()]
        # The client reads the token here (its refresh hook: a rotated file is re-read).
        return await client.call_api(
            split.path,
            method,
            query_params=query or None,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout if timeout is not None else self._timeout,
        )

    async def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> dict[str, Any]:
        """The decoded answer; raises KubeError for any status but 2xx."""
        import aiohttp

        try:
            response = await self._send(method, path, body=body, content_type=content_type)
            try:
                text = await response.text()
            finally:
                response.release()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise KubeError(0, str(error) or type(error).__name__) from None
        if response.status // 100 != 2:
            raise KubeError(response.status, text, retry_after=_retry_after(response))
        return json.loads(text) if text else {}

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

        query = dict(params or {})
        query.update(watch="true", timeoutSeconds=str(timeout_seconds))
        query["allowWatchBookmarks"] = "true"
        if resource_version:
            query["resourceVersion"] = resource_version
        timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30)
        try:
            response = await self._send("GET", path, params=query, timeout=timeout)
            try:
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
            finally:
                response.release()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise KubeError(0, str(error) or type(error).__name__) from None

    async def close(self) -> None:
        """Close the client's connections."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()


def _retry_after(response: Any) -> float | None:
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return None


def _expired(expiry: datetime.datetime) -> bool:
    now = datetime.datetime.now(expiry.tzinfo) if expiry.tzinfo else datetime.datetime.now()
    return now >= expiry - datetime.timedelta(seconds=10)


def namespace_in_cluster() -> str:
    """This pod's namespace (`RLSLICE_NAMESPACE` overrides)."""
    explicit = os.environ.get("RLSLICE_NAMESPACE")
    if explicit:
        return explicit
    file = SERVICE_ACCOUNT / "namespace"
    return file.read_text().strip() if file.exists() else "default"
