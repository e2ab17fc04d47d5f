"""`GpuPhaseCallback`: a `transformers.Trainer` callback that holds the group per step.

```python
from trl import GRPOTrainer
from rlslice.integrations.trl import GpuPhaseCallback

with GpuPhaseCallback(offload=True) as rlslice_callback:  # client from RLSLICE_*
    trainer = GRPOTrainer(..., callbacks=[rlslice_callback])
    trainer.train()
trainer.save_model()  # the weights are home: the job left the group without a snapshot
```

`offload=True` (the `app` backend) registers the model and the optimizer the Trainer
passes to `on_train_begin` (it creates the optimizer inside `train()`) with a
`TorchOffloader`, starts the offload loop (which registers the process with the agent)
and waits for its stream before the first step. A `TorchOffloader` given instead of True
gets the same two registrations, beside whatever else it holds.

TRL's trainers are `transformers.Trainer`s, which call each callback's `on_<event>(args,
state, control, **kwargs)`. This class has those methods (any event it does not handle is a
no-op, including ones a later transformers adds) and imports no framework.

`hold="step"` (the default) holds the group from `on_step_begin` to `on_step_end`: one
optimizer step, all its gradient-accumulation micro-batches, and in TRL's GRPO the
generation and reward scoring that `training_step` runs. When the trainer is about to log,
evaluate or save on the device right after the step (the flags its flow callback sets), or
the run is ending, the hold lasts until that is done, so the trainer never touches the GPU
outside a hold for those. Between steps the job holds nothing: the Trainer still moves the
next batch to the device there, which is fine with the `app` backend (tensors it does not
offload stay where they are) but not with `cuda`/`cuda-checkpoint`, which freeze every CUDA
call of a parked process until its next grant.

`hold="train"` is for those backends: the group is held from `on_train_begin` to
`on_train_end`, and at every step end it is *offered*: the job yields and queues again at
once, so a waiting job takes its turn between steps and this job never runs GPU code
without the group. With nobody waiting the offer costs two calls and moves nothing.

`offer="asked"` (with `hold="train"`) offers the group only when the scheduler asks for it
(`phase.should_yield()`): a job whose phase the group declares `rollout` keeps the group
across steps and ends its rollout early at the next step boundary once a `train` phase of
another job waits (early yield, docs/scheduler.md), or once it held past the group's
`max_hold_seconds`. A step is never cut: the trainer's steps are its safe points.
`early_yields` counts those offers.

The end of training: with a client the callback built, `on_train_end` leaves the group
for good while it still holds it (the client unregisters: the lock is given up and nothing
is snapshotted), so a waiting job's switch never parks this job's state on its way out.
The offload loop stops; state still parked then is copied back in-process. A client passed
in stays open and registered: `on_train_end` yields, and device state registered with the
agent may be parked afterwards; touch it only inside `client.phase(...)`.

The trainer calls no event when training fails: leave the `with` block (or call
`close()`) to give the group back; `close()` also closes a client the callback built.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from rlslice._errors import InvalidArgumentError
from rlslice._ids import validate_id
from rlslice.client import Client, Grant, validate_phase
from rlslice.integrations._offload import OffloadLoop

if TYPE_CHECKING:
    from rlslice.client.offload import TorchOffloader

__all__ = ["GpuPhaseCallback"]

log = logging.getLogger("rlslice.integrations.trl")

Hold = Literal["step", "train"]
Offer = Literal["step", "asked"]


class GpuPhaseCallback:
    """Hold the job's group for each optimizer step of a `transformers.Trainer` (TRL too).

    `client`: a `Client`, a factory returning one, or None (built at first use from the
    `RLSLICE_*` environment, and closed at `on_train_end` / `close()`). `phase` names the
    hold in the scheduler's timeline; `group` overrides the client's default group.
    `offload`: True (or a `TorchOffloader`) registers the trainer's model and optimizer and
    runs the `app` backend's offload loop for them (see the module doc). `offer`, with
    `hold="train"`: "step" offers the group at every step end, "asked" only when the
    scheduler asks (early yield of a rollout; see the module doc).
    """

    def __init__(
        self,
        client: Client | Callable[[], Client] | None = None,
        *,
        phase: str = "train",
        group: str | None = None,
        hold: Hold = "step",
        offload: bool | TorchOffloader = False,
        offer: Offer = "step",
    ) -> None:
        self.phase_name = validate_phase(phase)
        self.group = None if group is None else validate_id(group, "group")
        if hold not in ("step", "train"):
            raise InvalidArgumentError(f"hold: {hold!r} is not 'step' or 'train'")
        if offer not in ("step", "asked"):
            raise InvalidArgumentError(f"offer: {offer!r} is not 'step' or 'asked'")
        self.hold: Hold = hold
        self.offer: Offer = offer
        self.early_yields = 0
        """How many step ends gave the group up because the scheduler asked (offer="asked")."""
        self._client: Client | None = client if isinstance(client, Client) else None
        self._factory: Callable[[], Client] | None = None if isinstance(client, Client) else client
        self._owned = False
        self._finalizer: weakref.finalize[[Client], GpuPhaseCallback] | None = None
        self._phase: Any = None
        self._deferred = False
        self.last_grant: Grant | None = None
        """The grant of the latest acquire (None before the first)."""
        self.grants = 0
        """How many times the callback acquired the group."""
        self._offload: OffloadLoop | None = None
        if offload is not False:
            self._offload = OffloadLoop(None if offload is True else offload)

    @property
    def offloader(self) -> TorchOffloader | None:
        """The `TorchOffloader` of `offload=` (None without it, or before `on_train_begin`)."""
        return None if self._offload is None else self._offload.offloader

    # -- what the callback holds --------------------------------------------------------

    @property
    def held(self) -> bool:
        """Whether the callback holds the group now."""
        return self._phase is not None

    def should_yield(self) -> bool:
        """Whether the scheduler asks the job to give the group up (as of the last
        KeepAlive): a rollout while a train waits, or a hold past max_hold_seconds."""
        return self._phase is not None and bool(self._phase.should_yield())

    def client(self) -> Client:
        """The client the callback uses (built on first call when none was given)."""
        if self._client is None:
            built = Client() if self._factory is None else self._factory()
            if not isinstance(built, Client):
                raise TypeError(f"client: factory returned {built!r}, expected a Client")
            self._client, self._owned = built, True
            # Close a client we built when the callback is dropped or the process exits.
            self._finalizer = weakref.finalize(self, _close_quietly, built)
        return self._client

    def acquire(self) -> None:
        """Take the group unless the callback holds it already (blocks until granted)."""
        if self._phase is not None:
            return
        phase = self.client().phase(self.phase_name, self.group)
        self.last_grant = phase.__enter__()
        self._phase = phase
        self.grants += 1

    def yield_group(self) -> None:
        """Yield: give the group back if the callback holds it (the job stays registered)."""
        phase, self._phase = self._phase, None
        self._deferred = False
        if phase is not None:
            phase.__exit__(None, None, None)

    def close(self) -> None:
        """Leave: close a client the callback built (its Unregister gives the group back
        with nothing snapshotted) or yield a given one's hold; stop the offload loop and copy
        back in-process whatever is still parked."""
        finalizer, self._finalizer = self._finalizer, None
        try:
            if self._owned and finalizer is not None:
                # Unregistering while holding gives up the lock and parks nothing; a yield
                # first would let a waiting job's switch snapshot this job on its way out.
                self._phase, self._deferred = None, False
                self._client, self._owned = None, False
                finalizer()  # closes the client we built, once
            else:
                self.yield_group()
        finally:
            if self._offload is not None:
                self._offload.stop()

    def __enter__(self) -> GpuPhaseCallback:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- Trainer events -----------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """`offload`: register the model and optimizer, start the offload loop.
        `hold="train"`: take the group for the whole run."""
        self._start_offload(kwargs.get("model"), kwargs.get("optimizer"))
        if self.hold == "train":
            self.acquire()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Take the group for the step (once per optimizer step, not per micro-batch)."""
        if self._offload is not None and not self._offload.running:
            self._start_offload(kwargs.get("model"), kwargs.get("optimizer"))
        self.acquire()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Give the group back, unless device work follows at once (see the module doc)."""
        if self.hold == "train":
            if self.offer == "step":
                self._offer()
            elif self.should_yield():
                self.early_yields += 1
                self._offer()
        elif _device_work_follows(control, args):
            self._deferred = True
        else:
            self.yield_group()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The trainer logs, evaluates or saves after an epoch too: hold for that."""
        if self.hold == "step" and _device_work_follows(control, args):
            self.acquire()
            self._deferred = True

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Logging done: give a deferred hold back if nothing else follows."""
        self._settle(control, args, evaluated=False)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Evaluation done: give a deferred hold back if no save follows."""
        self._settle(control, args, evaluated=True)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Saving is the last thing after a step: give a deferred hold back."""
        if self._deferred and not control.should_training_stop:
            self.yield_group()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Leave the group (see `close()`): the trainer's state is home after `train()`."""
        self.close()

    def __getattr__(self, name: str) -> Callable[..., None]:
        # Every other event (on_init_end, on_substep_end, on_optimizer_step, ...) and any a
        # later transformers adds: nothing to do.
        if name.startswith("on_"):
            return _ignore
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return (
            f"<GpuPhaseCallback phase={self.phase_name!r} group={self.group!r} "
            f"hold={self.hold!r} offer={self.offer!r} held={self.held}>"
        )

    # -- helpers ------------------------------------------------------------------------

    def _start_offload(self, model: Any, optimizer: Any) -> None:
        loop = self._offload
        if loop is None or loop.running:
            return
        loop.register(model, optimizer)
        client = self.client()
        if client.disabled:
            return  # no scheduler, no switches: nothing will ask for the state
        group = self.group or client.group
        if not group:
            raise InvalidArgumentError(
                "group: offload=True needs a group (group= or RLSLICE_GROUP)"
            )
        loop.start(client.job, group, None)

    def _offer(self) -> None:
        # Yield, then queue again at once: a waiting job runs now, this one waits its turn.
        self.yield_group()
        self.acquire()

    def _settle(self, control: Any, args: Any, *, evaluated: bool) -> None:
        if not self._deferred:
            return
        pending = control.should_evaluate or control.should_save or control.should_training_stop
        if evaluated and _saves_best(args):
            pending = True  # the trainer decides after this event whether to save
        if not pending:
            self.yield_group()


def _device_work_follows(control: Any, args: Any) -> bool:
    """Whether the trainer touches the device right after this event: it logs (the loss is
    a device tensor), evaluates, saves, or ends the run (the final loss read)."""
    return bool(
        control.should_log
        or control.should_evaluate
        or control.should_save
        or control.should_training_stop
    )


def _saves_best(args: Any) -> bool:
    return str(getattr(args, "save_strategy", "")).lower().endswith("best")


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None


def _close_quietly(client: Client) -> None:
    try:
        client.close()
    except Exception:
        log.debug("closing the callback's client failed", exc_info=True)
