r"""Every flag of LeRobot 0.6.1's own ``lerobot-train --help`` against ours: accepted, or refused in one line.

1. help     (LeRobot env) runs LeRobot's ``lerobot-train --help`` and reads every flag it lists, outside
            ``--policy.*`` (each policy's fields are checked by its own interop driver), with its type and
            default.
2. ours     (our env, in-process) runs ``lerobot-train --dry_run=true`` on the demo dataset once per flag,
            with a valid value: LeRobot's default (its ``TrainPipelineConfig`` fields, read in its env; the
            help prints few), else a value from VALUES. Each flag
            must be accepted (the dry run passes) or refused in exactly one ``error:`` line that is not
            ``unknown flag`` and has no traceback. Flags whose feature this stack does not have are
            accepted at their off values (LeRobot's defaults) and refused when switched on: ACTIVATE gives
            those values, and each must be refused in one line.
3. table    prints flag, value, outcome and the reason of each refusal, and the counts.

    uv run python tools/interop/flags_lerobot_interop.py \
        --lerobot-python ~/.cache/lerobot-interop/lerobot-0.6.1-py312/bin/python

Exit status 0 means no LeRobot flag is unknown here and every expectation held.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
BASE = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--policy.type=act",
    "--policy.pretrained_backbone_weights=null",  # offline: no ImageNet download
    "--dry_run=true",
]
# Values for flags whose LeRobot default is none or cannot be given on a command line as printed.
VALUES = {
    "dataset.repo_id": "lerobot/demo_reach",
    "dataset.root": str(DEMO),
    "dataset.episodes": "[0,1,2]",
    "dataset.revision": "main",
    "dataset.video_backend": "pyav",
    "dataset.image_transforms.tfs": "{}",
    "job_name": "flags_check",
    "optimizer.type": "adamw",
    "scheduler.type": "cosine_decay_with_warmup",
    "peft.method_type": "LORA",
    "peft.r": "8",
    "peft.lora_alpha": "16",
    "peft.target_modules": "null",
    "peft.full_training_modules": "null",
    "peft.init_type": "null",
    "rename_map": "{}",
    "eval.recording_repo_id": "null",
    "job.tags": "[]",
    "env.type": "null",
}
# Values that switch on a feature this stack does not have: each must be refused in one line.
ACTIVATE = {
    "eval.recording": "true",  # lerobot-eval's rollouts recorded as a dataset
    "image_transforms": "transforms.json",  # a config file for dataset.image_transforms: pass flags here
    "job.target": "a10g-small",
    "reward_model.type": "classifier",
    "dataset.repo_type": "bucket",
    "dataset.depth_output_unit": "m",
    "dataset": "dataset.json",
}
SKIP = {  # flags that name a whole run's inputs, checked by their own tests
    "config_path": "a whole train_config.json: tests/test_train_cli.py and the resume tests",
}


# ------------------------------------------------------------------------------------------------ help
def lerobot_flags(lerobot_python: Path) -> dict[str, tuple[str, str | None]]:
    """{flag: (type, default)} from LeRobot's own ``lerobot-train --help``."""
    script = Path(lerobot_python).parent / "lerobot-train"
    out = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    body = out.split("\n\n", 1)[1] if "\n\n" in out else out
    flags: dict[str, tuple[str, str | None]] = {}
    for m in re.finditer(r"\[--([\w.]+)(?: ([^\]]+))?\]", out):  # the usage block: every flag and type
        flags.setdefault(m.group(1), (m.group(2) or "", None))
    for m in re.finditer(r"^  --([\w.]+)(?: (\S+))?(.*?)(?=^  --|\Z)", body, re.MULTILINE | re.DOTALL):
        text = " ".join(m.group(3).split())
        default = re.search(r"\(default: (.*?)\)$", text)
        flags[m.group(1)] = (m.group(2) or flags.get(m.group(1), ("", None))[0], default and default.group(1))
    return {k: v for k, v in flags.items() if not k.startswith("policy.") and k != "help"}


_DEFAULTS = r"""
import dataclasses, json, sys, typing
from lerobot.configs.train import TrainPipelineConfig

def walk(cls, prefix, out):
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        if dataclasses.is_dataclass(value):
            walk(type(value), prefix + f.name + ".", out)
            continue
        try:
            json.dumps(value)
        except TypeError:
            continue
        out[prefix + f.name] = value

from lerobot.configs.default import DatasetConfig
out = {}
walk(TrainPipelineConfig, "", out)
walk(DatasetConfig, "dataset.", out)  # the run's dataset has no default (its repo_id is required)
print(json.dumps(out))
"""


def lerobot_defaults(lerobot_python: Path) -> dict[str, object]:
    """{flag: default} of LeRobot's own TrainPipelineConfig (its dataclass fields, read in its env): the
    help prints a default only for fields with a comment."""
    res = subprocess.run(
        [str(lerobot_python), "-c", _DEFAULTS], capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def value_for(flag: str, default: str | None, defaults: dict[str, object]) -> str:
    if flag in VALUES:
        return VALUES[flag]
    if flag in defaults:
        return json.dumps(defaults[flag]) if not isinstance(defaults[flag], str) else defaults[flag]
    if default is None or default == "None":
        return "null"
    if default in ("True", "False"):
        return default.lower()
    if default.startswith(("{", "[")):
        return default.replace("'", '"')
    return default


# ------------------------------------------------------------------------------------------------ ours
def run_ours(args: list[str]) -> tuple[int, str]:
    """Our lerobot-train in this process; (exit code, stderr)."""
    from lerobot_cli.train import main

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(args)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # noqa: BLE001 (a traceback, whatever it is, is reported as one)
            return 99, f"TRACEBACK {type(exc).__name__}: {exc}"
    return rc, err.getvalue()


TINY_ACT = [
    "--policy.dim_model=16",
    "--policy.dim_feedforward=32",
    "--policy.n_heads=2",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
    "--policy.chunk_size=4",
    "--policy.n_action_steps=4",
]


def make_base(tmp: Path) -> Path:
    """A tiny ACT policy trained one step: the --policy.path LoRA adapters (--peft.*) need."""
    out = tmp / "base"
    flags = [a for a in BASE if a != "--dry_run=true"]
    rc, err = run_ours([*flags, *TINY_ACT, "--steps=1", "--num_workers=0", f"--output_dir={out}"])
    if rc != 0:
        raise SystemExit(f"could not train the PEFT base policy: {err[-2000:]}")
    return out / "checkpoints" / "000001" / "pretrained_model"


def outcome(flag: str, value: str, tmp: Path, base: Path) -> tuple[str, str]:
    """("accepted" | "refused" | "unknown" | "broken", detail)."""
    flags = BASE if not flag.startswith("peft.") else [*BASE[:2], f"--policy.path={base}", "--dry_run=true"]
    rc, err = run_ours([*flags, f"--{flag}={value}", f"--output_dir={tmp / 'out'}"])
    errors = [line for line in err.splitlines() if ": error: " in line]
    if rc == 0 and not errors:
        return "accepted", ""
    if rc == 99:
        return "broken", err
    if len(errors) == 1 and "unknown flag" in errors[0]:
        return "unknown", errors[0]
    if rc == 2 and len(errors) == 1 and "Traceback" not in err:
        return "refused", errors[0].split(": error: ", 1)[1]
    return "broken", f"rc {rc}: {err[-600:]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lerobot-python", type=Path, required=True)
    args = parser.parse_args()
    begin = time.monotonic()
    flags = lerobot_flags(args.lerobot_python)
    defaults = lerobot_defaults(args.lerobot_python)
    print(f"[help] LeRobot's lerobot-train --help lists {len(flags)} flags outside --policy.*")
    failures, counts = [], {"accepted": 0, "refused": 0, "skipped": 0}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = make_base(Path(tmp))
        for flag, (_kind, default) in sorted(flags.items()):
            if flag in SKIP:
                counts["skipped"] += 1
                rows.append((flag, "", "skipped", SKIP[flag]))
                continue
            value = value_for(flag, default, defaults)
            result, detail = outcome(flag, value, Path(tmp), base)
            if result in ("unknown", "broken"):
                failures.append(f"--{flag}={value}: {result}: {detail}")
            else:
                counts[result] += 1
            rows.append((flag, value, result, detail))
            if ACTIVATE.get(flag) is not None and ACTIVATE[flag] != value:
                on = ACTIVATE[flag]
                result, detail = outcome(flag, on, Path(tmp), base)
                rows.append((flag, on, result, detail))
                if result != "refused":
                    failures.append(f"--{flag}={on}: expected a one-line refusal, got {result}: {detail}")
    width = max(len(r[0]) for r in rows) + 2
    for flag, value, result, detail in rows:
        shown = value if len(value) <= 28 else value[:25] + "..."
        print(f"  --{flag:<{width}} {shown:<30} {result:<9} {detail[:150]}")
    print(
        f"[table] {len(flags)} flags: {counts['accepted']} accepted at LeRobot's defaults or given values, "
        f"{counts['refused']} refused in one line there, {counts['skipped']} checked elsewhere; "
        f"{sum(1 for f in ACTIVATE.values() if f)} features refused when switched on"
    )
    for failure in failures:
        print(f"FAIL {failure}")
    print(f"{'PASS' if not failures else 'FAIL'} ({time.monotonic() - begin:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
