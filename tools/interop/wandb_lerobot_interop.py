"""What LeRobot 0.6.1's ``WandBLogger`` sends to wandb against what our wandb tracker sends, same run.

Both sides run with a recording stand-in for the ``wandb`` module (LeRobot's environment has no wandb, and no
test reaches the network): the comparison is of the calls each makes — ``wandb.init``'s arguments (project,
entity, name, notes, tags, job_type, resume and run id, mode, dir, save_code), every ``wandb.log`` (keys,
values, step), and the model artifacts (name, type, files). LeRobot's side is its own code path end to end:
``MetricsTracker`` counting ``steps/samples/episodes/epochs`` over the steps, ``to_dict()``,
``WandBLogger.log_dict`` for train and eval, ``log_policy`` for each checkpoint. Ours feeds the same
per-step values through ``lerobot_cli.trackers.wandb.WandbTracker``. The config dict is not compared (each
stack logs its own ``train_config.json``). Cases: a fresh run with defaults; a resumed run (run id given)
with entity, notes, ``mode=offline``, ``add_tags=false`` and ``disable_artifact=true``.

    uv run python tools/interop/wandb_lerobot_interop.py --lerobot-python <LeRobot 0.6.1's python>
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

BATCH, WORLD, FRAMES, EPISODES = 8, 2, 1516, 30
LOG_STEPS = (2, 4, 6)
EVAL_STEPS = (3, 6)
CHECKPOINTS = (3, 6)
CASES = {
    "defaults": {"wandb": {}, "resume": False},
    "resumed": {
        "wandb": {
            "entity": "team",
            "notes": "a note",
            "run_id": "abc123xy",
            "mode": "offline",
            "add_tags": False,
            "disable_artifact": True,
        },
        "resume": True,
    },
}


def step_values(step: int) -> dict[str, float]:
    """The per-window means each stack's tracker holds at a log step (binary fractions: exact both ways)."""
    return {
        "loss": 1.0 / step,
        "grad_norm": 2.5 * step,
        "lr": 1e-4,
        "update_s": 0.125,
        "dataloading_s": 0.0625,
        "samples_per_s": 128.0,
        "l1_loss": 0.5 / step,
        "kld_loss": 0.25 / step,
    }


def eval_loss(step: int) -> float:
    return 0.75 / step


def fake_wandb(calls: list) -> types.ModuleType:
    """A ``wandb`` module that records what it is asked to do."""
    module = types.ModuleType("wandb")

    class Run:
        def __init__(self, run_id: str | None) -> None:
            self.id = run_id or "newrunid1"

        def get_url(self) -> str:
            return f"https://wandb.invalid/{self.id}"

    class Artifact:
        def __init__(self, name: str, type: str) -> None:
            self.name, self.type, self.files = name, type, []

        def add_file(self, path) -> None:
            self.files.append(Path(path).name)

    def init(**kwargs):
        calls.append(["init", {k: v for k, v in kwargs.items() if k != "config"}])
        module.run = Run(kwargs.get("id"))
        return module.run

    module.init = init
    module.log = lambda data, step=None: calls.append(["log", step, data])
    module.Artifact = Artifact
    module.log_artifact = lambda a: calls.append(["artifact", a.name, a.type, a.files])
    module.finish = lambda exit_code=0: calls.append(["finish"])
    module.define_metric = lambda *a, **k: None
    return module


def write_checkpoint(root: Path, step: int) -> Path:
    directory = root / "checkpoints" / f"{step:06d}"
    (directory / "pretrained_model").mkdir(parents=True, exist_ok=True)
    (directory / "pretrained_model" / "model.safetensors").write_bytes(b"weights")
    return directory


def lerobot_side(work: Path, case: str) -> list:
    """LeRobot's own WandBLogger and MetricsTracker, driven as lerobot_train.py drives them."""
    from types import SimpleNamespace

    from lerobot.common.wandb_utils import WandBLogger
    from lerobot.configs.default import WandBConfig
    from lerobot.utils.logging_utils import AverageMeter, MetricsTracker

    calls: list = []
    sys.modules["wandb"] = fake_wandb(calls)
    spec = CASES[case]
    out = work / case / "lerobot"
    cfg = SimpleNamespace(
        wandb=WandBConfig(enable=True, **spec["wandb"]),
        output_dir=out,
        job_name="act_demo",
        env=None,
        is_reward_model_training=False,
        policy=SimpleNamespace(type="act"),
        seed=1000,
        dataset=SimpleNamespace(repo_id="lerobot/demo_reach"),
        resume=spec["resume"],
        to_dict=dict,
    )
    logger = WandBLogger(cfg)
    meters = {k: AverageMeter(k, ":.3f") for k in step_values(1)}
    tracker = MetricsTracker(BATCH * WORLD, FRAMES, EPISODES, meters, initial_step=0)
    for step in range(1, max(LOG_STEPS) + 1):
        tracker.step()
        if step in LOG_STEPS:
            for name, value in step_values(step).items():
                setattr(tracker, name, value)
            logger.log_dict(tracker.to_dict(), step)
            tracker.reset_averages()
        if step in EVAL_STEPS:
            logger.log_dict({"eval_loss": eval_loss(step)}, step=step, mode="eval")
        if step in CHECKPOINTS:
            logger.log_policy(write_checkpoint(out, step))
    return calls


def ours_side(work: Path, case: str) -> list:
    from lerobot_cli.cli.argv import split_argv
    from lerobot_cli.cli.build import build_train_config
    from lerobot_cli.configio import unstructure_train_config
    from lerobot_cli.trackers import Record, RunContext
    from lerobot_cli.trackers.wandb import WandbTracker

    calls: list = []
    sys.modules["wandb"] = fake_wandb(calls)
    spec = CASES[case]
    out = work / case / "ours"
    flags = [
        "--dataset.repo_id=lerobot/demo_reach",
        "--policy.type=act",
        "--job_name=act_demo",
        f"--output_dir={out}",
        "--wandb.enable=true",
        *(f"--wandb.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in spec["wandb"].items()),
    ]
    cfg = build_train_config(split_argv(flags).flags).config
    ctx = RunContext(
        cfg=cfg,
        output_dir=out,
        resuming=spec["resume"],
        samples_per_step=BATCH * WORLD,
        num_frames=FRAMES,
        num_episodes=EPISODES,
        config=lambda: unstructure_train_config(cfg),
    )
    tracker = WandbTracker.start(ctx, resume_in_place=spec["resume"])
    for step in range(1, max(LOG_STEPS) + 1):
        if step in LOG_STEPS:
            values = step_values(step)
            values["data_s"] = values.pop("dataloading_s")  # our console's name
            values["samples"] = float(BATCH * WORLD)  # ours: this step's samples over ranks
            tracker.log(Record(step, 0.0, "train", values))
        if step in EVAL_STEPS:
            tracker.log(Record(step, 0.0, "eval", {"loss": eval_loss(step)}))
        if step in CHECKPOINTS:
            tracker.checkpoint(write_checkpoint(out, step))
    return calls


def normalised(calls: list, out_dir: str) -> list:
    """Each side's calls with its own output directory named alike, log values rounded to 12 digits."""
    result = []
    for call in calls:
        if call[0] == "init":
            args = dict(call[1])
            args["dir"] = "<output_dir>" if str(args.get("dir")) == out_dir else args.get("dir")
            result.append(["init", args])
        elif call[0] == "log":
            result.append(["log", call[1], {k: round(float(v), 12) for k, v in sorted(call[2].items())}])
        else:
            result.append(call)
    return result


def run_side(side: str, work: Path) -> dict:
    fn = lerobot_side if side == "lerobot" else ours_side
    return {case: normalised(fn(work, case), str(work / case / side)) for case in CASES}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", default="compare", choices=["compare", "lerobot", "ours"])
    parser.add_argument("--work", type=Path)
    parser.add_argument("--lerobot-python", default=sys.executable)
    args = parser.parse_args()
    if args.mode in ("lerobot", "ours"):
        print(json.dumps(run_side(args.mode, args.work), default=str))
        return 0
    with tempfile.TemporaryDirectory(prefix="wandb-interop-") as tmp:
        work, me = Path(tmp), str(Path(__file__).resolve())
        theirs = subprocess.run(
            [args.lerobot_python, me, "lerobot", "--work", str(work)],
            capture_output=True,
            text=True,
            check=False,
        )
        if theirs.returncode != 0:
            print(theirs.stderr[-3000:], file=sys.stderr)
            print("FAIL: LeRobot's side did not run")
            return 1
        lerobot = json.loads(theirs.stdout.strip().splitlines()[-1])
        ours = json.loads(json.dumps(run_side("ours", work), default=str))
    ok = True
    for case in CASES:
        a, b = lerobot[case], ours[case]
        same = a == b
        ok &= same
        logs = sum(1 for c in a if c[0] == "log")
        arts = [c[1] for c in a if c[0] == "artifact"]
        verdict = "PASS" if same else "FAIL"
        print(f"  {case:9s} init {a[0][1]}: {logs} wandb.log calls, artifacts {arts}: {verdict}")
        if not same:
            for x, y in zip(a, b, strict=False):
                if x != y:
                    print(f"    LeRobot: {x}\n    ours:    {y}")
            if len(a) != len(b):
                print(f"    LeRobot made {len(a)} calls, ours {len(b)}")
    print(f"wandb calls, LeRobot's WandBLogger vs ours: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
