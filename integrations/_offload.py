"""The offload loop a `GpuPhaseCallback(offload=True)` runs for its trainer (the `app` backend).

At `on_train_begin` the Trainer passes its model and, by then, its optimizer (created inside
`train()`, after the callbacks were built): both are registered with one `TorchOffloader`
("weights" and "optimizer"; Adam's moments appear at the first step and are found at each
offload), the offload loop starts in a thread and the callback waits until the agent has
the process's registration and its stream, so the first switch finds the job ready.

When the job leaves, the loop stops; state still parked then (the job left from outside a
hold, say after a failure) is copied back in-process, so the model is whole after `train()`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rlslice.client.offload import OffloadThread, start_offload_thread

if TYPE_CHECKING:
    from rlslice.client.offload import TorchOffloader

log = logging.getLogger("rlslice.integrations.trl")

#: Seconds `start` waits for the agent to take the stream.
CONNECT_SECONDS = 30.0


def _device_type(model: Any) -> str | None:
    for param in model.parameters():
        return str(param.device.type)
    return None


def _unwrap(optimizer: Any) -> Any:
    """accelerate's `AcceleratedOptimizer` wraps the torch optimizer as `.optimizer`."""
    import torch

    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


class OffloadLoop:
    """One trainer's registered state and the loop that moves it on the agent's command."""

    def __init__(self, offloader: TorchOffloader | None = None) -> None:
        self._given = offloader
        self.offloader: TorchOffloader | None = offloader
        self._thread: OffloadThread | None = None
        self._model: Any = None
        self._optimizer: Any = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def register(self, model: Any, optimizer: Any) -> None:
        """Register the trainer's model and optimizer (each once; the optimizer when the
        trainer has created it)."""
        from rlslice.client.offload import TorchOffloader

        if model is not None and self._model is None:
            if self.offloader is None:
                self.offloader = TorchOffloader(device_type=_device_type(model))
            self.offloader.register(model, "weights")
            self._model = model
        if optimizer is not None and self._optimizer is None and self.offloader is not None:
            self._optimizer = _unwrap(optimizer)
            self.offloader.register(self._optimizer, "optimizer")

    def start(self, job: str, group: str, socket_path: str | None) -> None:
        """Open the stream to the agent (registering this process) and wait for it."""
        if self._thread is not None:
            return
        if self.offloader is None:
            raise RuntimeError("offload: the trainer passed no model to on_train_begin")
        thread = start_offload_thread(self.offloader, job=job, group=group, socket_path=socket_path)
        try:
            thread.wait_connected(CONNECT_SECONDS)
        except BaseException:
            thread.stop()
            raise
        self._thread = thread
        log.info(
            "job %r: offload loop connected (group %r, tags %s)", job, group, self.offloader.tags
        )

    def stop(self) -> bool:
        """End the loop; bring parked state back in-process. True when something came back."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.stop()
        if self.offloader is None or not self.offloader.offloaded:
            return False
        result = self.offloader.restore()
        log.warning(
            "the job left with its state parked: %d bytes copied back in-process", result.bytes
        )
        return True
