"""Put the job's own local inference server to sleep and wake it: vLLM and SGLang.

Only a server on this host's loopback is ever called (127.0.0.1, ::1 or localhost, and the
port the job registered): the agent's command can never be turned into a request to an
arbitrary URL. Requests are plain HTTP/1.1 POSTs with the standard library; redirects are
not followed.

vLLM (started with `--enable-sleep-mode`, and `VLLM_SERVER_DEV_MODE=1` for the endpoints):
`POST /sleep?level=1` offloads weights to host memory and drops the KV cache; level 2 also
drops the weights (used when a command discards "weights"); `mode=wait` (sent by default)
drains requests in flight first, `keep` pauses them, `abort` drops them; `POST /wake_up`
brings it back. Either server's API key, when it has one, goes in `Authorization: Bearer`.
SGLang (started with `--enable-memory-saver`): `POST /release_memory_occupation` and
`POST /resume_memory_occupation`, with optional `{"tags": [...]}`; weights are dropped unless
the server keeps a CPU copy (`--enable-weights-cpu-backup`), so re-sync them after resume.

Bytes are the device memory freed or taken back, read from NVML around the call (0 when
NVML is not available in the workload).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from rlslice._errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from rlslice.client.offload._types import DISCARD, OFFLOAD, OffloadResult

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


def nvml_used_bytes() -> int | None:
    """Device memory used on every GPU together, from NVML; None when NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        total = 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            total += int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        return total
    except Exception:
        return None


class OffloadHttpServer:
    """A job's own HTTP server on loopback; the base of the vLLM and SGLang offloaders."""

    kind = ""

    def __init__(
        self,
        port: int,
        *,
        host: str = "127.0.0.1",
        timeout: float = 300.0,
        measure: Callable[[], int | None] = nvml_used_bytes,
        api_key: str | None = None,
    ) -> None:
        """`api_key`: the server's key (`--api-key`), sent as `Authorization: Bearer`; a
        server started with one refuses its memory endpoints without it."""
        if host not in LOOPBACK:
            raise InvalidArgumentError(
                f"host: {host!r} refused: only the job's own local server on loopback is called"
            )
        if not (isinstance(port, int) and 0 < port < 65536):
            raise InvalidArgumentError(f"port: {port!r} is not a TCP port")
        self.host = host
        self.port = port
        self._timeout = timeout
        self._measure = measure
        self._api_key = api_key
        self._asleep = False
        self._lock = threading.Lock()

    def _post(self, path: str, body: dict[str, Any] | None = None) -> str:
        data = json.dumps(body).encode() if body is not None else b""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self._timeout)
        try:
            headers = {"Content-Type": "application/json"}
            if self._api_key:
                headers["Authorization"] = f"Bearer {self._api_key}"
            conn.request("POST", path, body=data, headers=headers)
            response = conn.getresponse()
            text = response.read().decode(errors="replace")
        except OSError as error:
            raise UnavailableError(
                f"{self.kind}: POST {path} to {self.host}:{self.port}: {error}"
            ) from error
        finally:
            conn.close()
        if not 200 <= response.status < 300:
            raise FailedPreconditionError(
                f"{self.kind}: POST {path} answered {response.status}: {text.strip()[:200]}"
            )
        return text

    def _timed(self, call: Callable[[], object], sign: int) -> OffloadResult:
        start = time.perf_counter()
        before = self._measure()
        call()
        after = self._measure()
        moved = max(0, sign * (before - after)) if before is not None and after is not None else 0
        return OffloadResult(bytes=moved, seconds=time.perf_counter() - start)


#: What vLLM's `/sleep` does with requests in flight (its `mode` query parameter).
VLLM_SLEEP_MODES = ("abort", "wait", "keep")


class VllmOffloader(OffloadHttpServer):
    """vLLM sleep mode over HTTP: `/sleep?level=1|2&mode=...` and `/wake_up`."""

    kind = "vllm"

    def __init__(self, port: int, *, level: int = 1, mode: str = "wait", **kwargs: Any) -> None:
        """`level` 1 keeps the weights in host memory; 2 drops them (re-sync after wake).
        `mode`: what the server does with requests in flight: "wait" (the default here)
        drains them first, "keep" pauses them and resumes them at wake-up, "abort" (vLLM's
        own default) drops them. Servers older than the parameter ignore it and abort."""
        if level not in (1, 2):
            raise InvalidArgumentError(f"level: {level!r} is not 1 or 2")
        if mode not in VLLM_SLEEP_MODES:
            raise InvalidArgumentError(
                f"mode: {mode!r} is not one of {', '.join(VLLM_SLEEP_MODES)}"
            )
        super().__init__(port, **kwargs)
        self.level = level
        self.mode = mode

    @property
    def modes(self) -> frozenset[str]:
        return frozenset({OFFLOAD, DISCARD})

    @property
    def tags(self) -> tuple[str, ...]:
        return ("weights", "kv_cache")

    def offload(self, discard_tags: Sequence[str] = ()) -> OffloadResult:
        with self._lock:
            if self._asleep:
                return OffloadResult(bytes=0, seconds=0.0)
            level = 2 if "weights" in discard_tags else self.level
            path = f"/sleep?level={level}&mode={self.mode}"
            result = self._timed(lambda: self._post(path), +1)
            self._asleep = True
            return result

    def restore(self) -> OffloadResult:
        with self._lock:
            if not self._asleep:
                return OffloadResult(bytes=0, seconds=0.0)
            result = self._timed(lambda: self._post("/wake_up"), -1)
            self._asleep = False
            return result


class SglangOffloader(OffloadHttpServer):
    """SGLang memory release over HTTP: `/release_memory_occupation`, `/resume_memory_occupation`."""

    kind = "sglang"

    def __init__(
        self,
        port: int,
        *,
        tags: Sequence[str] | None = None,
        weights_cpu_backup: bool = False,
        **kwargs: Any,
    ) -> None:
        """`tags`: what to release (default: everything the server tracks). Set
        `weights_cpu_backup` when the server was started with `--enable-weights-cpu-backup`,
        so that weights count as offloaded rather than discarded."""
        super().__init__(port, **kwargs)
        self._release_tags = list(tags) if tags is not None else None
        self._backup = weights_cpu_backup

    @property
    def modes(self) -> frozenset[str]:
        return frozenset({OFFLOAD, DISCARD}) if self._backup else frozenset({DISCARD})

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(self._release_tags or ("weights", "kv_cache", "cuda_graph"))

    def _body(self) -> dict[str, Any]:
        return {"tags": self._release_tags} if self._release_tags is not None else {}

    def offload(self, discard_tags: Sequence[str] = ()) -> OffloadResult:
        with self._lock:
            if self._asleep:
                return OffloadResult(bytes=0, seconds=0.0)
            result = self._timed(lambda: self._post("/release_memory_occupation", self._body()), +1)
            self._asleep = True
            return result

    def restore(self) -> OffloadResult:
        with self._lock:
            if not self._asleep:
                return OffloadResult(bytes=0, seconds=0.0)
            result = self._timed(lambda: self._post("/resume_memory_occupation", self._body()), -1)
            self._asleep = False
            return result
