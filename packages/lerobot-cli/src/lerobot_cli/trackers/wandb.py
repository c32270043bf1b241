"""Weights & Biases, through the real ``wandb`` library (extra ``[wandb]``): ``--wandb.*`` as LeRobot 0.6.1
means them, so a LeRobot user's dashboard reads the same.

* One run per job, started by the main rank: ``project``, ``entity``, ``notes``, the job name as its name,
  the run's config, LeRobot's tags (``policy:<type>``, ``seed:<seed>``, ``dataset:<repo_id>``, each cut to
  wandb's 64 characters) unless ``--wandb.add_tags=false``, ``job_type=train_eval``, files under
  ``<output_dir>/wandb``; ``--wandb.mode`` online (default), offline or disabled.
* Metrics under LeRobot's names: ``train/loss``, ``train/grad_norm``, ``train/lr``, ``train/update_s``,
  ``train/dataloading_s`` (our ``data_s``), ``train/samples_per_s``, ``train/gpu_mem_gb``, the policy's loss
  parts, and LeRobot's counters ``train/steps``, ``train/samples``, ``train/episodes``, ``train/epochs``;
  the held-out loss as ``eval/eval_loss``. Our own additions keep their names under ``train/``.
* The run id is saved in ``train_config.json`` (``wandb.run_id``), as LeRobot does, so a resume in place
  continues the same run (``resume="must"``; offline runs share the id, and ``wandb sync`` joins them). A
  resume that branches into another directory starts a new run: it must not rewrite the first one's history.
* Each committed checkpoint's weights as a ``model`` artifact named ``<tags joined by ->-<step>`` (``:`` and
  ``/`` made ``_``), as LeRobot's ``log_policy``: ``model.safetensors``, or a PEFT run's adapter files,
  unless ``--wandb.disable_artifact=true``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from lerobot_ckpt.layout import PRETRAINED_MODEL_DIR

from lerobot_cli.trackers.base import Record, RunContext, TrackerStartError

_MAX_TAG = 64  # wandb refuses longer tags
_RENAMED = {"data_s": "dataloading_s"}  # ours -> LeRobot's wandb name
_MODEL_FILE = "model.safetensors"
_ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json", "config.json")


def lerobot_tags(cfg) -> list[str]:
    """LeRobot's ``cfg_to_group`` as a list: the run's tags, and (joined by ``-``) its artifacts' prefix."""
    repo = cfg.dataset.repo_id
    dataset = repo if isinstance(repo, str) or repo is None else json.dumps(list(repo), separators=(",", ":"))
    return [f"policy:{cfg.policy.type}", f"seed:{cfg.seed}", f"dataset:{dataset}"]


def artifact_name(cfg, step_dir: str) -> str:
    return re.sub(r"[:/]", "_", f"{'-'.join(lerobot_tags(cfg))}-{step_dir}")


def _previous_run_id(output_dir: Path) -> str | None:
    """LeRobot's fallback for a resume whose config has no run id: ``wandb/latest-run/run-<id>.wandb``
    (only the name is read, and only an id of wandb's alphabet is taken)."""
    latest = output_dir / "wandb" / "latest-run"
    try:
        names = [p.name for p in latest.iterdir()] if latest.is_dir() else []
    except OSError:
        return None
    ids = [m.group(1) for n in names if (m := re.fullmatch(r"run-([A-Za-z0-9_-]{1,64})\.wandb", n))]
    return ids[0] if len(ids) == 1 else None


class WandbTracker:
    name = "wandb"

    def __init__(self, ctx: RunContext, resume_in_place: bool) -> None:
        os.environ["WANDB_SILENT"] = "True"  # as LeRobot: its banner lines would interleave with ours
        # wandb's own crash reports (Sentry) off unless asked for: offline, or on a cluster without internet
        # access, they retry in the background and print connection warnings among the training lines
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        import wandb

        cfg, wcfg = ctx.cfg, ctx.cfg.wandb
        self._wandb = wandb
        self._cfg, self._disable_artifact = cfg, wcfg.disable_artifact
        self._samples_per_step, self._frames = ctx.samples_per_step, ctx.num_frames
        self._frames_per_episode = ctx.num_frames / max(ctx.num_episodes, 1)
        run_id = None
        if resume_in_place:
            run_id = wcfg.run_id or _previous_run_id(ctx.output_dir)
        try:
            self.run = wandb.init(
                id=run_id,
                project=wcfg.project,
                entity=wcfg.entity,
                name=cfg.job_name,
                notes=wcfg.notes,
                tags=[t[:_MAX_TAG] for t in lerobot_tags(cfg)] if wcfg.add_tags else None,
                dir=str(ctx.output_dir),
                config=ctx.config(),
                save_code=False,
                job_type="train_eval",
                resume="must" if run_id is not None else None,
                mode=wcfg.mode or "online",
            )
        except Exception as exc:  # wandb's errors (no login, no network, a run that is not there) and OSError
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise TrackerStartError(
                f"--wandb.enable=true: wandb could not start the run ({type(exc).__name__}: {text}); log in "
                "with `wandb login` (or set WANDB_API_KEY), or pass --wandb.mode=offline to write the run "
                "under --output_dir and `wandb sync` it later"
            ) from exc
        mode = wcfg.mode or "online"
        self.label = f"wandb ({mode}, run {self.run.id}" + (", resumed)" if run_id is not None else ")")

    @classmethod
    def start(cls, ctx: RunContext, resume_in_place: bool) -> WandbTracker:
        return cls(ctx, resume_in_place)

    def log(self, record: Record) -> None:
        if record.kind == "eval":
            data = {("eval/eval_loss" if k == "loss" else f"eval/{k}"): v for k, v in record.metrics.items()}
        else:
            samples = record.step * self._samples_per_step
            counters = {
                "steps": record.step,
                "samples": samples,
                "episodes": samples / self._frames_per_episode,
                "epochs": samples / self._frames,
            }
            # our ``samples`` (this step's, over ranks) gives way to LeRobot's running count
            values = {**{_RENAMED.get(k, k): v for k, v in record.metrics.items()}, **counters}
            data = {f"train/{k}": v for k, v in {**values, **record.extra}.items()}
        self._wandb.log(data, step=record.step)

    def checkpoint(self, directory: Path) -> None:
        if self._disable_artifact:
            return
        pretrained = Path(directory) / PRETRAINED_MODEL_DIR
        adapter = pretrained / _ADAPTER_FILES[0]
        if adapter.is_file():  # a PEFT run: the adapter and the configs that load it
            files = [pretrained / name for name in _ADAPTER_FILES if (pretrained / name).is_file()]
        elif (pretrained / _MODEL_FILE).is_file():
            files = [pretrained / _MODEL_FILE]
        else:  # a --checkpoint_format=dcp checkpoint has shards only
            logging.getLogger("lerobot-train").warning(
                f"wandb: {pretrained} has no {_MODEL_FILE} (a sharded checkpoint: lerobot-convert-dcp writes "
                "one), so no model artifact was logged for it"
            )
            return
        artifact = self._wandb.Artifact(artifact_name(self._cfg, Path(directory).name), type="model")
        for path in files:
            artifact.add_file(str(path))
        self._wandb.log_artifact(artifact)

    def video(self, key: str, path: Path, step: int, fps: int) -> None:
        """LeRobot's ``log_video``: ``wandb.Video(path, fps=<env fps>, format="mp4")`` under ``key``."""
        self._wandb.log({key: self._wandb.Video(str(path), fps=fps, format="mp4")}, step=step)

    def saved_config(self) -> dict:
        return {"wandb": {"run_id": self.run.id}}

    def finish(self, failed: bool = False) -> None:
        self._wandb.finish(exit_code=1 if failed else 0)
