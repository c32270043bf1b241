"""The training step loop: micro-batches, gradient accumulation, update, metrics, hooks.

Semantics (fixed by the user docs, and the same whatever the number of processes):

* One *loop step* = every dp worker trains on one micro-batch. ``--steps`` counts loop steps.
* With K accumulation steps the loss is divided by K and gradients are all-reduced only on
  the K-th micro-batch (DDP ``no_sync`` / FSDP ``set_requires_gradient_sync(False)`` before it,
  through ``WrappedModel.gradient_sync``); clipping, the optimizer step and ``zero_grad``
  happen on that micro-batch only. K micro-batches of B on W workers thus equal one batch of
  B·W·K samples, which the equivalence tests check. Under FSDP2/HSDP the optimizer holds the
  sharded parameters and clipping computes one global norm over the sharded (DTensor) gradients,
  returned as a plain (non-DTensor) 0-d tensor.
* The LR scheduler steps once per loop step (accelerate's ``step_scheduler_with_optimizer=False``),
  except when the fp16 loss scaler skipped the optimizer step: then the schedule waits too.
* A non-finite loss stops the run with the rank and the step where it first appeared in the
  message, unless allowed (then one warning names that step). The loss is always back-propagated, so
  DDP's collectives stay matched across ranks.

No host syncs on ordinary steps: the loss, its ``info`` parts and the gradient norm stay on the device
(0-d tensors in :class:`StepOutput`, summed into the metric meters on the device), and the
non-finite check is a device-side record of the first loop step whose loss was NaN/inf
(``torch.where`` on a device int, no read). The host reads the device only when something needs the
values: at a step where a hook is due (with the metric window, in the same single collective and
single device→host copy, when a hook asks for metrics; hooks registered with ``check_finite=False``
need nothing), and at the end of :meth:`TrainLoop.run`. So a checkpoint hook never saves after a
non-finite loss went unnoticed, and a log step raises for a NaN of any step in its window. The fp16
path keeps its inherent syncs: ``GradScaler.step`` reads ``found_inf`` to decide whether to skip the
update, and the skip decides the scheduler step. Step timings (``step_s``, ``data_s``, ``update_s``)
are host times; on an accelerator the host runs ahead of the device by at most its launch queue, and
the wait for the device happens in the log step's read, which no step's time counts.

The model contract is ``loss, info = model(batch)``; ``info`` values are floats or one-element
tensors (kept on the device, detached).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from attrs import define
from lerobot_parallel.config import AcceleratorConfig
from lerobot_parallel.grad_clip import clip_grad_norm
from lerobot_parallel.precision import Precision, build_precision
from lerobot_parallel.wrap import WrappedModel

from lerobot_trainloop.batch import batch_size_of, move_to_device
from lerobot_trainloop.ema import ModelEma
from lerobot_trainloop.hooks import Hook, ScheduledHook, schedule
from lerobot_trainloop.memory import peak_memory
from lerobot_trainloop.metrics import MetricsTracker, accumulation_dtype, gather_rows
from lerobot_trainloop.sampler import ShardedBatchSampler

if TYPE_CHECKING:  # the loop only holds a source (its caller iterates it): no loader import at run time
    from lerobot_trainloop.data_source import DataSource

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
    """The loss was NaN/inf at some loop step; raised, on every dp rank alike, at the first read after it
    (a hook step or the end of the run), naming the rank and the step where it first appeared."""


@define(frozen=True)
class StepOutput:
    """What one loop step did on this rank."""

    step: int  # loop steps completed, counting this one
    # This rank's micro-batch loss before the 1/K accumulation scaling: a detached 0-d tensor on the
    # device (``float()`` it where a host number is needed; that waits for the device).
    loss: torch.Tensor
    info: dict[str, float | torch.Tensor]  # the model's parts, tensors detached and left on the device
    synced: bool  # last micro-batch of an accumulation window: gradients were all-reduced
    optimizer_stepped: bool
    skipped: bool  # the fp16 scaler found inf/nan gradients and skipped the update (and the scheduler)
    grad_norm: torch.Tensor | None  # total norm before clipping (0-d, on the device); None: no clipping
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

    The data position has one owner: ``sampler`` (a ``ShardedBatchSampler`` the loop consumes once per
    step) or ``data`` (a :class:`~lerobot_trainloop.data_source.DataSource`, which counts the batches it
    hands out itself: run the loop on it). Never both, or every step would be counted twice.
    :attr:`position` is whichever is given: what a checkpoint saves and a resume restores.
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
        ema: ModelEma | None = None,
        data: DataSource | None = None,
    ) -> None:
        if not isinstance(wrapped, WrappedModel):
            raise TypeError(
                f"TrainLoop drives what lerobot_parallel.wrap_model returns (a WrappedModel), got "
                f"{type(wrapped).__name__}: wrap it with wrap_model(model, runtime, build_plan(...))"
            )
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
        if sampler is not None and data is not None:
            raise ValueError(
                "TrainLoop takes sampler= or data=, not both: a data source counts its own batches, and the "
                "loop would consume the sampler a second time"
            )
        self.sampler = sampler
        self.data = data
        # Updated after every optimizer update. One the fp16 loss scaler skipped is none: the weights did not
        # move, so the EMA neither steps nor counts it in its decay schedule (LeRobot's counts it).
        self.ema = ema
        self.step = 0  # a resumed run restores it with load_state_dict
        self.optimizer_steps = 0
        self.skipped_updates = 0
        self.metrics = MetricsTracker(DEFAULT_REDUCTIONS)
        self.hooks: list[ScheduledHook] = []
        self._clip_params = wrapped.parameters_for_clipping()
        # The device-side non-finite record: the first loop step (1-based; 0 = none) whose loss was
        # NaN/inf on this rank, and that loss. Created at the first step, on the loss's device.
        self._bad_step: torch.Tensor | None = None
        self._bad_loss: torch.Tensor | None = None
        self._checked_at = -1  # the loop step at which the record was last read
        self._warned_nonfinite = False

    @property
    def position(self) -> ShardedBatchSampler | DataSource | None:
        """The owner of the data position (``data`` or ``sampler``; None: the loop has none): its
        ``state_dict()`` is the checkpoint's sampler entry, its ``load_state_dict()`` resumes it."""
        return self.data if self.data is not None else self.sampler

    # -- schedule -------------------------------------------------------------------------
    def add_hook(
        self,
        fn: Hook,
        *,
        every: int | None = None,
        at: Iterable[int] = (),
        metrics: bool = False,
        check_finite: bool = True,
    ) -> None:
        """Call ``fn(StepEvent)`` after loop steps ``every``-multiples and/or ``at``, on every rank.

        ``metrics=True`` reduces the metric window over ranks at those steps (a collective) and
        starts a new window; use it for logging. Before a hook runs, the loop reads the non-finite
        record (a host sync; a collective over dp ranks when distributed, folded into the metrics one
        when there is one) and raises :class:`NonFiniteLossError` rather than run it after a NaN/inf
        loss: a checkpoint hook never saves such a state. ``check_finite=False`` is for hooks that
        read nothing of the step (a progress bar, an interrupt check): at a step where only such hooks
        are due nothing is read, so an every-step hook costs no sync.
        """
        self.hooks.append(schedule(fn, every=every, at=at, metrics=metrics, check_finite=check_finite))

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
            loss_value = loss.detach()
            self._note_nonfinite(loss_value)
            self.precision.backward(loss / k if k > 1 else loss)
        stepped = skipped = False
        grad_norm = None
        if sync:
            t_up = time.perf_counter()
            self.precision.unscale_(self.optimizer)
            if self.grad_clip_norm is not None:
                grad_norm = clip_grad_norm(self._clip_params, self.grad_clip_norm).detach()
            stepped = self.precision.step(self.optimizer)
            skipped = not stepped
            self.optimizer.zero_grad(set_to_none=True)
            if self.ema is not None and stepped:  # an update the fp16 scaler skipped did not move the weights
                self.ema.update()
            self.optimizer_steps += stepped
            self.skipped_updates += skipped
            self.metrics.update("update_s", time.perf_counter() - t_up)
        if self.scheduler is not None and not skipped:
            self._scheduler_step()
        self.step += 1
        if self.sampler is not None:
            self.sampler.consume(1)
        lr = self.optimizer.param_groups[0]["lr"] if self.optimizer.param_groups else None
        info = {
            name: v.detach() if isinstance(v, torch.Tensor) else float(v) for name, v in (info or {}).items()
        }
        out = StepOutput(
            step=self.step,
            loss=loss_value,
            info=info,
            synced=sync,
            optimizer_stepped=stepped,
            skipped=skipped,
            grad_norm=grad_norm,
            lr=None if lr is None else float(lr),
        )
        self._record(out, batch, data_s, time.perf_counter() - t0)
        self._fire_hooks(out)
        return out

    # -- the non-finite record ----------------------------------------------------------------
    def _note_nonfinite(self, loss: torch.Tensor) -> None:
        """Keep the first non-finite loop step on the device: a few tiny kernels, no host read."""
        if self._bad_step is None:
            self._bad_step = torch.zeros((), dtype=torch.int64, device=loss.device)
            self._bad_loss = torch.zeros((), dtype=torch.float32, device=loss.device)
        loss = loss.reshape(()).to(self._bad_step.device)
        first = ~torch.isfinite(loss) & (self._bad_step == 0)
        self._bad_step = torch.where(first, self.step + 1, self._bad_step)
        self._bad_loss = torch.where(first, loss.float(), self._bad_loss)

    def _status(self, device: torch.device) -> torch.Tensor:
        """``[first non-finite step, its loss]`` on ``device`` (zeros before the first step)."""
        dtype = accumulation_dtype(device)
        if self._bad_step is None:
            return torch.zeros(2, dtype=dtype, device=device)
        return torch.stack([self._bad_step.to(dtype), self._bad_loss.to(dtype)]).to(device)

    def check_finite(self) -> None:
        """Read the non-finite record of every dp rank (a host sync; a collective when distributed, so
        every rank calls it at the same step) and raise :class:`NonFiniteLossError` if any rank's loss
        was NaN/inf at a step so far. ``run`` calls it at hook steps and at its end; a loop of your own
        around :meth:`train_step` calls it before anything that must not follow a NaN (a save)."""
        device = self.runtime.device
        self._judge(gather_rows(self._status(device), self.runtime.dp_group, self.runtime.dp_world_size))

    def _judge(self, rows: list[list[float]]) -> None:
        """Raise (or warn once, when allowed) for the earliest non-finite step in the gathered records."""
        self._checked_at = self.step
        bad = [(int(step), rank, loss) for rank, (step, loss) in enumerate(rows) if step > 0]
        if not bad:
            return
        step, index, value = min(bad)
        group = self.runtime.dp_group
        rank = (
            dist.get_global_rank(group, index) if group is not None and len(rows) > 1 else self.runtime.rank
        )
        where = f"rank {rank}: loss is {value} at loop step {step}"
        if step != self.step:
            where += f" (read at loop step {self.step}: losses are read at log, checkpoint and hook steps)"
        if not self.allow_nonfinite_loss:
            raise NonFiniteLossError(
                f"{where}; stopping. Check the data and learning rate (or use bf16 rather than fp16), or "
                "allow non-finite losses to continue anyway (allow_nonfinite_loss)."
            )
        if not self._warned_nonfinite:
            self._warned_nonfinite = True
            logger.warning(
                "%s; continuing because non-finite losses are allowed (said once; later ones are not "
                "reported)",
                where,
            )

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
        """The current window over all dp ranks, plus ``samples_per_s`` (cluster-wide: samples per loop
        step / slowest rank's step time) and the peak memory (``gpu_mem_gb`` on CUDA, else
        ``peak_rss_gb``; max over ranks); resets it. One collective when distributed and one
        device→host read, which also carry the non-finite record: raises :class:`NonFiniteLossError`
        like :meth:`check_finite`."""
        rt = self.runtime
        memory = peak_memory(rt.device)
        if memory is not None:
            self.metrics.update(*memory, reduction="max")
        packed = torch.cat([self.metrics.pack(rt.device), self._status(rt.device)])
        rows = gather_rows(packed, rt.dp_group, rt.dp_world_size)
        self._judge([row[-2:] for row in rows])
        reduced = self.metrics.combine(
            [row[:-2] for row in rows], rank=dist.get_rank(rt.dp_group) if len(rows) > 1 else 0
        )
        samples, step_s = reduced.get("samples", math.nan), reduced.get("step_s", math.nan)
        reduced["samples_per_s"] = samples / step_s if step_s > 0 else math.nan
        self.metrics.reset()
        return reduced

    def _fire_hooks(self, out: StepOutput) -> None:
        due = [h for h in self.hooks if h.due(out.step)]
        if not due:
            return
        metrics = None
        if any(h.metrics for h in due):
            metrics = self.reduce_metrics()  # carries the non-finite check
        elif any(h.check_finite for h in due):
            self.check_finite()
        event = StepEvent(loop=self, output=out, metrics=metrics)
        for hook in due:
            hook.fn(event)

    # -- whole run ------------------------------------------------------------------------
    def run(self, batches: Iterable, num_steps: int) -> int:
        """Train until ``num_steps`` loop steps are done (counting resumed ones); returns the step.

        A finite iterable is iterated again when exhausted (a DataLoader reshuffles); one that
        yields nothing stops the run with an error. The non-finite record is read at its end (unless
        the last step's hooks just did), so a NaN after the last log step still stops the run.
        """
        if not self.is_sync_step(num_steps) and num_steps > self.step:
            logger.warning(
                "loop step %d is not the end of a %d-step gradient-accumulation window: the last %d "
                "micro-batch(es) of this run are not applied by an update",
                num_steps,
                self.grad_accum_steps,
                num_steps % self.grad_accum_steps,
            )
        it = iter(batches)
        fresh = True
        while self.step < num_steps:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                if fresh:
                    raise RuntimeError(
                        f"the data iterable yielded no batch (at loop step {self.step})"
                    ) from None
                it, fresh = iter(batches), True
                continue
            fresh = False
            self.train_step(batch, data_s=time.perf_counter() - t0)
        if self._checked_at != self.step:
            self.check_finite()
        return self.step

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The loop's own counters, JSON-able (the scaler, optimizer and sampler have their own states)."""
        state = {
            "step": self.step,
            "optimizer_steps": self.optimizer_steps,
            "skipped_updates": self.skipped_updates,
            "grad_accum_steps": self.grad_accum_steps,
            "accumulated": self.accumulated,
        }
        if self.ema is not None:
            state["ema_updates"] = self.ema.updates
        return state

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
        if self.ema is not None and "ema_updates" in state:  # its tensors are the checkpoint loader's
            self.ema.load_state_dict({"updates": state["ema_updates"]})
        notes = []
        if pending:
            notes.append(
                f"the checkpoint was saved at loop step {step}, inside a {saved_k}-step "
                f"gradient-accumulation window: the gradients of its last {pending} micro-batch(es) (steps "
                f"{step - pending + 1}-{step}) were not saved and are not applied"
            )
        if step % k:
            first = step + k - step % k
            notes.append(
                f"the first update after the resume (at step {first}) uses the {first - step} "
                f"micro-batch(es) of steps {step + 1}-{first}, not {k}: "
                f"step {step} is not a multiple of the {k} accumulation steps"
            )
        return notes
