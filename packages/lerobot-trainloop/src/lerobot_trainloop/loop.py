"""The training step loop: micro-batches, gradient accumulation, update, metrics, hooks.

Semantics (fixed by the user docs, and the same whatever the number of processes):

* One *loop step* = every dp worker trains on one micro-batch. ``--steps`` counts loop steps.
* With K accumulation steps the loss is divided by K and gradients are all-reduced only on
  the K-th micro-batch (DDP ``no_sync`` / FSDP ``set_requires_gradient_sync(False)`` before it,
  through ``WrappedModel.gradient_sync``); clipping, the optimizer step and ``zero_grad``
  happen on that micro-batch only. K micro-batches of B on W workers thus equal one batch of
  B·W·K samples, which the equivalence tests check. Under FSDP2/HSDP the optimizer holds the
  sharded parameters and clipping computes one global norm over the sharded (DTensor) gradients,
  logged as a plain float.
* The LR scheduler steps once per loop step (accelerate's ``step_scheduler_with_optimizer=False``),
  except when the fp16 loss scaler skipped the optimizer step: then the schedule waits too.
* A non-finite loss stops the run with the rank and step in the message, unless allowed. The
  loss is still back-propagated when allowed, so DDP's collectives stay matched across ranks.

The model contract is ``loss, info = model(batch)`` with float-valued ``info``.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from attrs import define
from lerobot_parallel.config import AcceleratorConfig
from lerobot_parallel.grad_clip import clip_grad_norm
from lerobot_parallel.precision import Precision, build_precision
from lerobot_parallel.wrap import WrappedModel

from lerobot_trainloop.batch import batch_size_of, move_to_device
from lerobot_trainloop.hooks import Hook, ScheduledHook, schedule
from lerobot_trainloop.metrics import MetricsTracker
from lerobot_trainloop.sampler import ShardedBatchSampler

logger = logging.getLogger(__name__)

DEFAULT_REDUCTIONS = {
    "loss": "mean",
    "data_s": "max",
    "step_s": "max",
    "update_s": "max",
    "samples": "sum",  # per-rank mean micro-batch size, summed: cluster samples per loop step
    "lr": "local",
    "grad_norm": "local",  # identical on every rank once gradients are synchronised
}


class NonFiniteLossError(FloatingPointError):
    """The loss was NaN/inf; raised on the rank that saw it."""


@define(frozen=True)
class StepOutput:
    """What one loop step did on this rank."""

    step: int  # loop steps completed, counting this one
    loss: float  # this rank's micro-batch loss, before the 1/K accumulation scaling
    info: dict[str, float]
    synced: bool  # last micro-batch of an accumulation window: gradients were all-reduced
    optimizer_stepped: bool
    skipped: bool  # the fp16 scaler found inf/nan gradients and skipped the update (and the scheduler)
    grad_norm: float | None
    lr: float | None


@define(frozen=True)
class StepEvent:
    """What a hook receives. ``metrics`` is the window reduced over ranks (same on every rank),
    present when any hook due at this step asked for it."""

    loop: TrainLoop
    output: StepOutput
    metrics: dict[str, float] | None = None

    @property
    def step(self) -> int:
        return self.output.step


class TrainLoop:
    """Drives a model wrapped by ``lerobot_parallel.wrap_model`` one loop step at a time.

    ``wrapped`` brings the module (``self.model``), its runtime (``self.runtime``: device, dp group)
    and its gradient synchronisation, so the loop cannot be handed a topology other than the one the
    model was wrapped for. Use :meth:`run` for a whole run, or :meth:`train_step` from your own
    loop; both keep the accumulation phase, scheduler, sampler position, metrics and hooks consistent.
    """

    def __init__(
        self,
        wrapped: WrappedModel,
        optimizer: torch.optim.Optimizer,
        *,
        scheduler: Any | None = None,
        accelerator: AcceleratorConfig | None = None,
        precision: Precision | None = None,
        grad_clip_norm: float | None = None,
        allow_nonfinite_loss: bool = False,
        sampler: ShardedBatchSampler | None = None,
    ) -> None:
        if not isinstance(wrapped, WrappedModel):
            raise TypeError(f"TrainLoop drives what lerobot_parallel.wrap_model returns (a WrappedModel), got "
                            f"{type(wrapped).__name__}: wrap it with wrap_model(model, runtime, build_plan(...))")
        accelerator = accelerator or AcceleratorConfig()
        self.wrapped = wrapped
        self.model = wrapped.model
        self.optimizer = optimizer
        self.runtime = wrapped.runtime
        self.scheduler = scheduler
        self.precision = precision or build_precision(accelerator.mixed_precision, self.runtime.device)
        self.grad_accum_steps = accelerator.gradient_accumulation.steps
        if grad_clip_norm is not None and not grad_clip_norm > 0:
            raise ValueError(f"grad_clip_norm must be > 0 or None, got {grad_clip_norm!r}")
        self.grad_clip_norm = grad_clip_norm
        self.allow_nonfinite_loss = allow_nonfinite_loss
        self.sampler = sampler
        self.step = 0  # a resumed run restores it with load_state_dict
        self.optimizer_steps = 0
        self.skipped_updates = 0
        self.metrics = MetricsTracker(DEFAULT_REDUCTIONS)
        self.hooks: list[ScheduledHook] = []
        self._clip_params = wrapped.parameters_for_clipping()

    # -- schedule -------------------------------------------------------------------------
    def add_hook(self, fn: Hook, *, every: int | None = None, at: Iterable[int] = (), metrics: bool = False) -> None:
        """Call ``fn(StepEvent)`` after loop steps ``every``-multiples and/or ``at``, on every rank.

        ``metrics=True`` reduces the metric window over ranks at those steps (a collective) and
        starts a new window; use it for logging.
        """
        self.hooks.append(schedule(fn, every=every, at=at, metrics=metrics))

    def is_sync_step(self, step: int | None = None) -> bool:
        """Whether loop step ``step`` (1-based; default: the next one) closes an accumulation window.

        Windows are aligned to multiples of K from step 0, whatever resumes happened in between, so
        checkpoints taken every multiple of K are always at window boundaries.
        """
        step = self.step + 1 if step is None else step
        return step % self.grad_accum_steps == 0

    @property
    def accumulated(self) -> int:
        """Micro-batches already accumulated in the open window (0 at a window boundary)."""
        return self.step % self.grad_accum_steps

    @property
    def at_window_boundary(self) -> bool:
        """No gradient is pending: a checkpoint taken now resumes exactly."""
        return self.accumulated == 0

    # -- one step -------------------------------------------------------------------------
    def train_step(self, batch: Any, data_s: float = 0.0) -> StepOutput:
        """Train on this rank's micro-batch for one loop step (``data_s``: time spent fetching it)."""
        t0 = time.perf_counter()
        k = self.grad_accum_steps
        sync = self.is_sync_step()
        batch = move_to_device(batch, self.runtime.device)
        with self.wrapped.gradient_sync(sync):
            with self.precision.autocast():
                loss, info = self.model(batch)
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                self._non_finite(loss_value)
            self.precision.backward(loss / k if k > 1 else loss)
        stepped = skipped = False
        grad_norm = None
        if sync:
            t_up = time.perf_counter()
            self.precision.unscale_(self.optimizer)
            if self.grad_clip_norm is not None:
                grad_norm = float(clip_grad_norm(self._clip_params, self.grad_clip_norm))
            stepped = self.precision.step(self.optimizer)
            skipped = not stepped
            self.optimizer.zero_grad(set_to_none=True)
            self.optimizer_steps += stepped
            self.skipped_updates += skipped
            self.metrics.update("update_s", time.perf_counter() - t_up)
        if self.scheduler is not None and not skipped:
            self._scheduler_step()
        self.step += 1
        if self.sampler is not None:
            self.sampler.consume(1)
        lr = self.optimizer.param_groups[0]["lr"] if self.optimizer.param_groups else None
        info = {name: float(v) for name, v in (info or {}).items()}
        out = StepOutput(step=self.step, loss=loss_value, info=info, synced=sync, optimizer_stepped=stepped,
                         skipped=skipped, grad_norm=grad_norm, lr=None if lr is None else float(lr))
        self._record(out, batch, data_s, time.perf_counter() - t0)
        self._fire_hooks(out)
        return out

    def _non_finite(self, value: float) -> None:
        where = f"rank {self.runtime.rank}: loss is {value} at loop step {self.step + 1}"
        if not self.allow_nonfinite_loss:
            raise NonFiniteLossError(
                f"{where}; stopping. Check the data and learning rate (or use bf16 rather than fp16), or "
                "allow non-finite losses to continue anyway (allow_nonfinite_loss)."
            )
        logger.warning("%s; continuing because non-finite losses are allowed", where)

    def _scheduler_step(self) -> None:
        if self.optimizer_steps == 0:
            # With accumulation the schedule legitimately advances before the first update.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
                self.scheduler.step()
        else:
            self.scheduler.step()

    def _record(self, out: StepOutput, batch: Any, data_s: float, compute_s: float) -> None:
        m = self.metrics
        m.update("loss", out.loss)
        for name, value in out.info.items():
            m.update(name, value)
        m.update("data_s", data_s)
        m.update("step_s", data_s + compute_s)
        n = batch_size_of(batch)
        if n is not None:
            m.update("samples", n)
        if out.lr is not None:
            m.update("lr", out.lr)
        if out.grad_norm is not None and not out.skipped:  # an overflow's inf norm would swamp the window
            m.update("grad_norm", out.grad_norm)

    def reduce_metrics(self) -> dict[str, float]:
        """The current window over all dp ranks (collective when distributed), plus
        ``samples_per_s`` (cluster-wide: samples per loop step / slowest rank's step time); resets it."""
        reduced = self.metrics.reduce(self.runtime.dp_group, self.runtime.device, self.runtime.dp_world_size)
        samples, step_s = reduced.get("samples", math.nan), reduced.get("step_s", math.nan)
        reduced["samples_per_s"] = samples / step_s if step_s > 0 else math.nan
        self.metrics.reset()
        return reduced

    def _fire_hooks(self, out: StepOutput) -> None:
        due = [h for h in self.hooks if h.due(out.step)]
        if not due:
            return
        metrics = self.reduce_metrics() if any(h.metrics for h in due) else None
        event = StepEvent(loop=self, output=out, metrics=metrics)
        for hook in due:
            hook.fn(event)

    # -- whole run ------------------------------------------------------------------------
    def run(self, batches: Iterable, num_steps: int) -> int:
        """Train until ``num_steps`` loop steps are done (counting resumed ones); returns the step.

        A finite iterable is iterated again when exhausted (a DataLoader reshuffles); one that
        yields nothing stops the run with an error.
        """
        if not self.is_sync_step(num_steps) and num_steps > self.step:
            logger.warning(
                "loop step %d is not the end of a %d-step gradient-accumulation window: the last %d "
                "micro-batch(es) of this run are not applied by an update", num_steps, self.grad_accum_steps,
                num_steps % self.grad_accum_steps)
        it = iter(batches)
        fresh = True
        while self.step < num_steps:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                if fresh:
                    raise RuntimeError(f"the data iterable yielded no batch (at loop step {self.step})") from None
                it, fresh = iter(batches), True
                continue
            fresh = False
            self.train_step(batch, data_s=time.perf_counter() - t0)
        return self.step

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The loop's own counters, JSON-able (the scaler, optimizer and sampler have their own states)."""
        return {"step": self.step, "optimizer_steps": self.optimizer_steps, "skipped_updates": self.skipped_updates,
                "grad_accum_steps": self.grad_accum_steps, "accumulated": self.accumulated}

    def load_state_dict(self, state: dict) -> list[str]:
        """Continue from ``state``; returns what a resume should tell the user (nothing is logged here).

        A state saved at a window boundary, resumed with the same K, continues exactly. Otherwise
        the notes say what differs from an uninterrupted run: a state saved inside a window (by a
        trainer that saves mid-window) lacks that window's gradients, which no checkpoint holds;
        and a step that is not a multiple of the (new) K makes the first window after it short.
        """
        step = int(state["step"])
        if step < 0:
            raise ValueError(f"invalid loop state: step={step}")
        k = self.grad_accum_steps
        saved_k = max(int(state.get("grad_accum_steps", k)), 1)
        pending = int(state["accumulated"]) if "accumulated" in state else step % saved_k
        self.step = step
        self.optimizer_steps = int(state.get("optimizer_steps", (step - pending) // saved_k))
        self.skipped_updates = int(state.get("skipped_updates", 0))
        notes = []
        if pending:
            notes.append(
                f"the checkpoint was saved at loop step {step}, inside a {saved_k}-step gradient-accumulation window: "
                f"the gradients of its last {pending} micro-batch(es) (steps {step - pending + 1}-{step}) were not "
                "saved and are not applied")
        if step % k:
            first = step + k - step % k
            notes.append(
                f"the first update after the resume (at step {first}) uses the {first - step} micro-batch(es) of "
                f"steps {step + 1}-{first}, not {k}: step {step} is not a multiple of the {k} accumulation steps")
        return notes
