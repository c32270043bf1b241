"""Default flags, both trainers, one LeRobot-written dataset: the saved processor files must be the same.

The other drivers hand both sides the same processors; this one lets each side build its own from the
dataset, as a user's run does, so a default that differs (``--dataset.use_imagenet_stats``: LeRobot 0.6.1
replaces every camera's mean and std with ImageNet's by default) shows up in the files. For each policy
(every registered policy LeRobot also has, read from our registry: act, diffusion, pi0, pi05, smolvla,
fastwam; one without flags in ``SAME`` nor a reason in ``NOT_CHECKED`` fails the run before anything
else), with the default and with ``--dataset.use_imagenet_stats=false``,
every file ``policy_preprocessor*`` / ``policy_postprocessor*`` must be equal: the JSON files as parsed
JSON, the state files key for key (same keys, shapes, dtypes and values, exactly). act and diffusion are
also fine-tuned with ``--policy.path`` (both sides from the same LeRobot-trained ``pretrained_model/``) on a
second dataset whose ``meta/stats.json`` differs: LeRobot's ``lerobot-train`` then normalises with that
dataset's statistics (ImageNet's camera mean/std under the default) and the policy's features, not the
checkpoint's, and so must ours. Runs in two interpreters:

    uv run python tools/interop/defaults_lerobot_interop.py --lerobot-python <LeRobot env>/bin/python

1. lerobot-side (LeRobot env, one process: its imports are paid once)
   - writes a small video dataset (3 episodes, a 64×64 camera, state, action, one task) with LeRobot's own
     writer (``LeRobotDataset.create`` / ``add_frame`` / ``save_episode``, its default codec and its
     statistics, quantiles included, which pi05 needs);
   - act, diffusion: trains from scratch with LeRobot's own ``lerobot-train`` (``lerobot.scripts.
     lerobot_train:main``, its console script, called in this process once per run with its command line
     in ``sys.argv``): default flags but what a CPU run offline needs (tiny sizes, no ImageNet backbone
     download, 1 step, batch 2, 0 workers);
   - act, diffusion fine-tune: the dataset copied with other statistics in ``meta/stats.json`` (state mean
     +1.5, action std ×2, the camera's mean, std and min changed; the frames are the same), then
     ``lerobot-train --policy.path=<its {policy}_false checkpoint's pretrained_model>`` on that copy, 1 step,
     default flags and with ``--dataset.use_imagenet_stats=false``. The base was trained with the first
     dataset's own camera statistics, so each statistic a fine-tune saves differs from the base's;
   - pi0, pi05, smolvla, fastwam: LeRobot cannot build these offline on a CPU (PaliGemma's 3B weights and
     tokenizer, SmolVLM2's, Wan2.2's VAE and UMT5), so its ``lerobot-train`` is followed up to its
     processors and no further: the same command line parsed by its own parser into its
     ``TrainPipelineConfig`` (``cfg.validate()``), ``make_train_eval_datasets(cfg)`` (its dataset factory,
     where ``use_imagenet_stats`` acts), the policy features ``make_policy`` fills in from the dataset,
     then ``make_pre_post_processors(cfg.policy, pretrained_path=None, dataset_stats=dataset.meta.stats)``
     and ``save_pretrained`` as its checkpoint does; LeRobot's policy defaults otherwise
     (gemma_2b/gemma_300m, its FastWAM), whose sizes its processors do not read. pi0/pi05's PaliGemma
     tokenizer is the repository's byte-level stand-in (data/tokenizers/demo_bytes), named as on our side;
     SmolVLA's ``vlm_model_name`` is the shipped tiny SmolVLM (data/vlms/smolvlm_tiny) on both sides,
     whose tokenizer both pre-processors load.
2. ours (this env, one process): ``lerobot-train`` (``lerobot_cli.train.main``) for each policy and flag
   on the same dataset, from scratch, 1 step: act/diffusion with LeRobot's tiny sizes; pi0/pi05/fastwam with
   the tiny variants (``gemma_tiny`` / ``variant=tiny``) and the demo tokenizer, smolvla on the tiny
   SmolVLM; then the same fine-tunes
   from LeRobot's base ``pretrained_model/`` (our checkpoints being LeRobot's format, it loads as a user's
   download would).
3. compare: every file of both ``pretrained_model/`` directories, and the cameras' saved mean/std printed
   (pi0, pi05 and FastWAM normalise VISUAL with IDENTITY, so there the camera's statistics are saved but
   change no input). Each flag value must also change the camera's mean/std on both sides. A fine-tune's
   files must be equal too, and on each side its saved state mean, action std (pre and post) and camera
   min must be the second dataset's, its camera mean/std ImageNet's under the default and the second
   dataset's under ``false``: equal files that both kept the base's statistics would prove nothing.

Exit status 0 means every comparison passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "data" / "tokenizers" / "demo_bytes"
DEMO_VLM = REPO / "data" / "vlms" / "smolvlm_tiny"  # SmolVLA's vlm_model_name: config.json + tokenizer
PALIGEMMA = "google/paligemma-3b-pt-224"
REPO_ID = "local/imagenet_defaults"
CAMERA = "observation.images.top"
TRAINED_BY_LEROBOT = ("act", "diffusion")  # the others: LeRobot's processors only (see the docstring)
FINE_TUNE_BASE = "false"  # fine-tunes start from LeRobot's {policy}_false: the first dataset's camera stats
FLAGS = {"default": [], "false": ["--dataset.use_imagenet_stats=false"]}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
# Flags both trainers get: offline on a CPU, small and fast; nothing that touches normalisation.
COMMON = ["--policy.device=cpu", "--steps=1", "--batch_size=2", "--num_workers=0", "--seed=1000"]
TINY_ACT = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2"]
SAME = {  # policy -> flags both sides take (LeRobot's field names, which ours share)
    "act": ["--policy.type=act", "--policy.pretrained_backbone_weights=null", *TINY_ACT],
    "diffusion": [
        "--policy.type=diffusion",
        "--policy.pretrained_backbone_weights=null",
        "--policy.down_dims=[32,64]",
        "--policy.horizon=8",
        "--policy.n_action_steps=4",
    ],
    "pi0": ["--policy.type=pi0"],
    "pi05": ["--policy.type=pi05"],
    # SmolVLA's tokenizer is vlm_model_name's: both sides read the shipped tiny SmolVLM's (LeRobot's field)
    "smolvla": ["--policy.type=smolvla", f"--policy.vlm_model_name={DEMO_VLM}"],
    "fastwam": [
        "--policy.type=fastwam",
        "--policy.action_dim=2",
        "--policy.proprio_dim=2",
        "--policy.image_size=[32,32]",
    ],
}
OURS_ONLY = {  # our tiny variants (LeRobot has none; its processors do not depend on the model's size)
    "pi0": [
        "--policy.paligemma_variant=gemma_tiny",
        "--policy.action_expert_variant=gemma_tiny",
        "--policy.vision_variant=tiny",
        "--policy.image_resolution=[56,56]",
        "--policy.chunk_size=4",
        "--policy.n_action_steps=4",
        f"--policy.tokenizer_name={TOKENIZER}",
    ],
    "fastwam": [
        "--policy.variant=tiny",
        "--policy.torch_dtype=float32",
        f"--policy.tokenizer_model_id={TOKENIZER}",
        "--policy.num_video_frames=5",
        "--policy.action_video_freq_ratio=1",
        "--policy.action_horizon=8",
        "--policy.n_action_steps=8",
    ],
}
OURS_ONLY["pi05"] = OURS_ONLY["pi0"]
OURS_ONLY["smolvla"] = [  # sizes LeRobot's processors do not read (its side builds no model)
    "--policy.num_vlm_layers=4",
    "--policy.resize_imgs_with_padding=[32,32]",
    "--policy.chunk_size=4",
    "--policy.n_action_steps=4",
]
# Registered policies LeRobot also has that this driver does not run, and why (a decision, not an omission).
NOT_CHECKED: dict[str, str] = {}
LEROBOT_ONLY = ["--policy.push_to_hub=false", "--wandb.enable=false"]


def registered_in_lerobot() -> list[str]:
    """Our registered policies that LeRobot 0.6.1 also has (their specs' ``in_lerobot``; our env only)."""
    from lerobot_cli.policies import manifest

    return manifest.in_lerobot()


def coverage_problems(in_lerobot: list[str]) -> list[str]:
    """What keeps this driver from covering exactly ``in_lerobot``: a policy with neither flags nor a reason
    (a new policy, silently unchecked otherwise), or flags for a policy that is not one of them."""
    problems = [
        f"policy {name!r} registered (in LeRobot) but has no flags in SAME nor a reason in NOT_CHECKED: "
        "add one"
        for name in in_lerobot
        if name not in SAME and name not in NOT_CHECKED
    ]
    problems += [
        f"{table} names {name!r}, not a registered policy LeRobot has"
        for table, names in (("SAME", SAME), ("NOT_CHECKED", NOT_CHECKED))
        for name in names
        if name not in in_lerobot
    ]
    return problems


def _case(policy: str, flag: str) -> str:
    return f"{policy}_{flag}"


def _tune_case(policy: str, flag: str) -> str:
    return f"{policy}_finetune_{flag}"


def _pretrained(work: Path, side: str, case: str) -> Path:
    return work / side / case / "checkpoints" / "last" / "pretrained_model"


def _tune_argv(policy: str, flag: str, work: Path, output_dir: Path, extra: list[str]) -> list[str]:
    """A fine-tune of LeRobot's base checkpoint on the second dataset: ``--policy.path`` brings the policy's
    config (its tiny sizes included), so only what the run itself needs is passed."""
    return [
        f"--dataset.repo_id={REPO_ID}",
        f"--dataset.root={work / 'dataset_tune'}",
        f"--policy.path={_pretrained(work, 'lerobot', _case(policy, FINE_TUNE_BASE))}",
        *extra,
        *COMMON,
        *FLAGS[flag],
        f"--output_dir={output_dir}",
    ]


def tune_stats(stats: dict) -> dict:
    """The second dataset's ``meta/stats.json``: the first's with the state mean shifted, the action std
    scaled and the camera's mean, std and min changed (its max, count and quantiles kept)."""
    stats = json.loads(json.dumps(stats))
    stats["observation.state"]["mean"] = [m + 1.5 for m in stats["observation.state"]["mean"]]
    stats["action"]["std"] = [s * 2 for s in stats["action"]["std"]]
    camera = stats[CAMERA]
    camera["mean"] = [[[v]] for v in (0.3, 0.5, 0.2)]
    camera["std"] = [[[v]] for v in (0.11, 0.07, 0.13)]
    camera["min"] = [[[c[0][0] + 0.01]] for c in camera["min"]]
    return stats


def write_tune_dataset(work: Path) -> None:
    """The dataset copied, frames and all, with :func:`tune_stats`'s ``meta/stats.json``."""
    import shutil

    tune = work / "dataset_tune"
    if (tune / "meta" / "info.json").is_file():
        return
    shutil.copytree(work / "dataset", tune)
    stats_file = tune / "meta" / "stats.json"
    stats_file.write_text(json.dumps(tune_stats(json.loads(stats_file.read_text())), indent=4))
    print(f"[lerobot] wrote {tune}: the dataset with other statistics")


def _argv(policy: str, flag: str, dataset: Path, output_dir: Path, extra: list[str]) -> list[str]:
    return [
        f"--dataset.repo_id={REPO_ID}",
        f"--dataset.root={dataset}",
        *SAME[policy],
        *extra,
        *COMMON,
        *FLAGS[flag],
        f"--output_dir={output_dir}",
    ]


# ---------------------------------------------------------------- LeRobot side (imports lerobot)


def lerobot_write_dataset(root: Path) -> None:
    """3 episodes of 20 frames written by LeRobot's own writer; the camera's colours keep its mean far from
    ImageNet's (blue-heavy, a different level per episode)."""
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.state": {"dtype": "float32", "shape": (2,), "names": ["x", "y"]},
        "action": {"dtype": "float32", "shape": (2,), "names": ["x", "y"]},
        CAMERA: {"dtype": "video", "shape": (64, 64, 3), "names": ["height", "width", "channels"]},
    }
    dataset = LeRobotDataset.create(REPO_ID, fps=10, features=features, root=root, use_videos=True)
    rng = np.random.default_rng(0)
    for episode in range(3):
        for _ in range(20):
            image = np.empty((64, 64, 3), np.uint8)
            image[..., 0] = 40 + 20 * episode
            image[..., 1] = rng.integers(50, 70, (64, 64))
            image[..., 2] = rng.integers(80, 200, (64, 64))
            dataset.add_frame(
                {
                    "observation.state": rng.random(2, dtype=np.float32),
                    "action": rng.random(2, dtype=np.float32),
                    CAMERA: image,
                    "task": "reach the target",
                }
            )
        dataset.save_episode()
    dataset.finalize()
    print(f"[lerobot] wrote {root} with LeRobot's writer")


def _paligemma_is_the_demo_tokenizer():
    """Point LeRobot's hard-coded PaliGemma tokenizer at the repository's byte-level one (offline)."""
    import lerobot.processor.tokenizer_processor as tokenizer_module

    real = tokenizer_module.AutoTokenizer

    class _Demo:
        @staticmethod
        def from_pretrained(name, *args, **kwargs):
            return real.from_pretrained(str(TOKENIZER) if name == PALIGEMMA else name, *args, **kwargs)

    tokenizer_module.AutoTokenizer = _Demo


def lerobot_processors(argv: list[str]) -> None:
    """LeRobot's ``lerobot-train`` for a policy it cannot build here, up to its saved processors."""
    from lerobot.configs import parser
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.configs.types import FeatureType
    from lerobot.datasets.factory import make_train_eval_datasets
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.utils.feature_utils import dataset_to_policy_features

    def build(cfg: TrainPipelineConfig) -> None:
        cfg.validate()
        dataset, _ = make_train_eval_datasets(cfg)
        policy = cfg.policy
        # what make_policy(cfg.policy, ds_meta=dataset.meta) does to the config before building the model
        features = dataset_to_policy_features(dataset.meta.features)
        policy.output_features = {k: f for k, f in features.items() if f.type is FeatureType.ACTION}
        if not policy.input_features:
            policy.input_features = {k: f for k, f in features.items() if k not in policy.output_features}
        if hasattr(policy, "action_feature_names"):
            names = dataset.meta.features.get("action", {}).get("names")
            if names is not None:
                policy.action_feature_names = list(names)
        fit = getattr(policy, "set_dataset_feature_metadata", None)
        if callable(fit):  # FastWAM: its cameras from the dataset, at their share of image_size
            fit(dataset.meta.features)
        policy._runtime_dataset_meta = dataset.meta
        pre, post = make_pre_post_processors(
            policy_cfg=policy, pretrained_path=None, dataset_stats=dataset.meta.stats
        )
        for step in pre.steps:
            if getattr(step, "tokenizer_name", None) == PALIGEMMA:
                step.tokenizer_name = str(TOKENIZER)  # the name our side was given
        out = Path(cfg.output_dir) / "checkpoints" / "last" / "pretrained_model"
        pre.save_pretrained(str(out))
        post.save_pretrained(str(out))

    build.__annotations__["cfg"] = TrainPipelineConfig  # a class, not this module's postponed string
    sys.argv = ["lerobot-train", *argv]
    parser.wrap()(build)()


def lerobot_side(work: Path, policies: list[str]) -> None:
    from lerobot.scripts.lerobot_train import main as lerobot_train

    _paligemma_is_the_demo_tokenizer()
    dataset = work / "dataset"
    if not (dataset / "meta" / "info.json").is_file():
        lerobot_write_dataset(dataset)
    write_tune_dataset(work)
    for policy in policies:
        for flag in FLAGS:
            argv = _argv(policy, flag, dataset, work / "lerobot" / _case(policy, flag), LEROBOT_ONLY)
            print(f"[lerobot] {_case(policy, flag)}: lerobot-train {' '.join(argv)}", flush=True)
            if policy in TRAINED_BY_LEROBOT:
                sys.argv = ["lerobot-train", *argv]
                lerobot_train()
            else:
                lerobot_processors(argv)
        if policy not in TRAINED_BY_LEROBOT:
            continue
        for flag in FLAGS:
            tag = _tune_case(policy, flag)
            argv = _tune_argv(policy, flag, work, work / "lerobot" / tag, LEROBOT_ONLY)
            print(f"[lerobot] {tag}: lerobot-train {' '.join(argv)}", flush=True)
            sys.argv = ["lerobot-train", *argv]
            lerobot_train()


# ---------------------------------------------------------------- our side (imports lerobot_cli)


def ours_side(work: Path, policies: list[str]) -> None:
    from lerobot_cli.train import main as lerobot_train

    for policy in policies:
        for flag in FLAGS:
            argv = _argv(
                policy, flag, work / "dataset", work / "ours" / _case(policy, flag), OURS_ONLY.get(policy, [])
            )
            print(f"[ours] {_case(policy, flag)}: lerobot-train {' '.join(argv)}", flush=True)
            if lerobot_train(argv) != 0:
                raise SystemExit(f"[ours] {_case(policy, flag)}: lerobot-train failed")
        if policy not in TRAINED_BY_LEROBOT:
            continue
        for flag in FLAGS:
            tag = _tune_case(policy, flag)
            argv = _tune_argv(policy, flag, work, work / "ours" / tag, [])
            print(f"[ours] {tag}: lerobot-train {' '.join(argv)}", flush=True)
            if lerobot_train(argv) != 0:
                raise SystemExit(f"[ours] {tag}: lerobot-train failed")


# ---------------------------------------------------------------- comparison (torch + safetensors only)


def _files(directory: Path) -> list[str]:
    return sorted(
        p.name
        for p in directory.iterdir()
        if p.name.startswith(("policy_preprocessor", "policy_postprocessor"))
    )


def _camera_stats(directory: Path) -> dict[str, list[float]]:
    from safetensors.torch import load_file

    name = next(n for n in _files(directory) if "_normalizer_processor" in n and n.startswith("policy_pre"))
    state = load_file(str(directory / name))
    return {s: [round(v, 4) for v in state[f"{CAMERA}.{s}"].flatten().tolist()] for s in ("mean", "std")}


def compare_case(tag: str, work: Path) -> tuple[bool, dict]:
    import torch
    from safetensors.torch import load_file

    theirs, ours = _pretrained(work, "lerobot", tag), _pretrained(work, "ours", tag)
    ok = True
    if _files(theirs) != _files(ours):
        print(f"[{tag}] processor files differ: LeRobot {_files(theirs)}, ours {_files(ours)}")
        return False, {}
    tensors = 0
    for name in _files(theirs):
        if name.endswith(".json"):
            a, b = json.loads((theirs / name).read_text()), json.loads((ours / name).read_text())
            if a != b:
                print(f"[{tag}] {name} DIFFERS:\n    LeRobot {json.dumps(a)}\n    ours    {json.dumps(b)}")
                ok = False
            continue
        a, b = load_file(str(theirs / name)), load_file(str(ours / name))
        if set(a) != set(b):
            print(
                f"[{tag}] {name}: keys only LeRobot's {sorted(set(a) - set(b))}, "
                f"only ours {sorted(set(b) - set(a))}"
            )
            ok = False
        for key in sorted(set(a) & set(b)):
            tensors += 1
            x, y = a[key], b[key]
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
                diff = (x.double() - y.double()).abs().max().item() if x.shape == y.shape else float("nan")
                print(
                    f"[{tag}] {name} {key}: LeRobot {tuple(x.shape)} {x.dtype}, ours {tuple(y.shape)} "
                    f"{y.dtype}, max |Δ| {diff:.3e}"
                )
                ok = False
    cameras = {"lerobot": _camera_stats(theirs), "ours": _camera_stats(ours)}
    print(
        f"[{tag}] {'EQUAL' if ok else 'DIFFER'}: {len(_files(theirs))} files, {tensors} tensors; {CAMERA} "
        f"mean/std LeRobot {cameras['lerobot']['mean']}/{cameras['lerobot']['std']}, ours "
        f"{cameras['ours']['mean']}/{cameras['ours']['std']}"
    )
    return ok, cameras


def compare(work: Path, policies: list[str]) -> bool:
    ok = True
    for policy in policies:
        cameras = {}
        for flag in FLAGS:
            good, cameras[flag] = compare_case(_case(policy, flag), work)
            ok &= good
        for side in ("lerobot", "ours"):  # the flag must act on both sides, or the equality proves little
            default, dataset = cameras["default"].get(side), cameras["false"].get(side)
            if default is None or dataset is None:
                continue
            if tuple(default["mean"]) != IMAGENET_MEAN or dataset["mean"] == default["mean"]:
                print(
                    f"[{policy}] {side}: the default's camera mean {default['mean']} is not ImageNet's, or "
                    f"--dataset.use_imagenet_stats=false did not change it ({dataset['mean']})"
                )
                ok = False
        if policy in TRAINED_BY_LEROBOT:
            for flag in FLAGS:
                good, _ = compare_case(_tune_case(policy, flag), work)
                ok &= good & tune_took_dataset_stats(policy, flag, work)
    return ok


def tune_took_dataset_stats(policy: str, flag: str, work: Path) -> bool:
    """Each side's fine-tune saved the second dataset's statistics (ImageNet's camera mean/std under the
    default), not its base checkpoint's: the files' equality alone would pass if both sides kept those."""
    import torch
    from safetensors.torch import load_file

    tag = _tune_case(policy, flag)
    stats = json.loads((work / "dataset_tune" / "meta" / "stats.json").read_text())
    camera = {s: torch.tensor(stats[CAMERA][s], dtype=torch.float32) for s in ("mean", "std", "min")}
    if flag == "default":
        camera["mean"] = torch.tensor(IMAGENET_MEAN, dtype=torch.float32).view(3, 1, 1)
        camera["std"] = torch.tensor((0.229, 0.224, 0.225), dtype=torch.float32).view(3, 1, 1)
    wanted = {
        "pre": {
            "observation.state.mean": torch.tensor(stats["observation.state"]["mean"], dtype=torch.float32),
            "action.std": torch.tensor(stats["action"]["std"], dtype=torch.float32),
            **{f"{CAMERA}.{s}": value for s, value in camera.items()},
        },
        "post": {"action.std": torch.tensor(stats["action"]["std"], dtype=torch.float32)},
    }
    ok = True
    for side in ("lerobot", "ours"):
        directory = _pretrained(work, side, tag)
        for kind, values in wanted.items():
            name = next(
                n
                for n in _files(directory)
                if n.startswith(f"policy_{kind}processor") and "normalizer_processor" in n
            )
            state = load_file(str(directory / name))
            for key, value in values.items():
                if key not in state or not torch.equal(state[key], value):
                    got = state[key].flatten().tolist() if key in state else None
                    print(f"[{tag}] {side} {name} {key}: {got}, expected {value.flatten().tolist()}")
                    ok = False
    if ok:
        print(f"[{tag}] both sides normalise with the second dataset's statistics, not the checkpoint's")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "mode", nargs="?", default="run", choices=["run", "lerobot-side", "ours-side", "compare"]
    )
    parser.add_argument("dir", nargs="?", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument(
        "--lerobot-python",
        default="/tmp/lerobot-venv/bin/python",
        help="interpreter of the environment where LeRobot is installed",
    )
    parser.add_argument(
        "--policy", choices=sorted(SAME), action="append", help="policies to check (default: all)"
    )
    args = parser.parse_args()
    policies = args.policy or sorted(SAME)
    if args.mode == "lerobot-side":
        lerobot_side(args.dir, policies)
        return 0
    if args.mode == "ours-side":
        ours_side(args.dir, policies)
        return 0
    if args.mode == "compare":
        return 0 if compare(args.dir, policies) else 1
    in_lerobot = registered_in_lerobot()
    problems = coverage_problems(in_lerobot)
    for line in problems:
        print(f"defaults: FAIL: {line}")
    if problems:
        return 1
    policies = args.policy or [name for name in in_lerobot if name in SAME]
    for name in in_lerobot:
        if name in NOT_CHECKED:
            print(f"defaults: not checked: {name} ({NOT_CHECKED[name]})")
    with tempfile.TemporaryDirectory(prefix="defaults-interop-") as tmp:
        work = args.dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "HF_HOME": str(work / "hf"),
            "HF_LEROBOT_HOME": str(work / "home"),
        }
        me = str(Path(__file__).resolve())
        flags = [arg for policy in policies for arg in ("--policy", policy)]
        lerobot = subprocess.run(
            [args.lerobot_python, me, "lerobot-side", str(work), *flags],
            env=env,
            check=False,
            capture_output=True,
            text=True,
        )
        # its own lines only: LeRobot logs its whole config per run (and torchcodec's failed loads)
        print("\n".join(line for line in lerobot.stdout.splitlines() if line.startswith("[lerobot]")))
        if lerobot.returncode != 0:
            print(f"{lerobot.stdout[-3000:]}\n{lerobot.stderr[-5000:]}")
            print("defaults: FAIL: LeRobot's side did not finish")
            return 1
        ours = subprocess.run(
            [sys.executable, me, "ours-side", str(work), *flags],
            env=env,
            check=False,
            capture_output=True,
            text=True,
        )
        print("\n".join(line for line in ours.stdout.splitlines() if line.startswith("[ours]")))
        if ours.returncode != 0:
            print(f"{ours.stdout[-3000:]}\n{ours.stderr[-5000:]}")
            print("defaults: FAIL: our side did not finish")
            return 1
        ok = compare(work, policies)
    print(
        f"defaults: {'PASS' if ok else 'FAIL'}: both trainers' processor files with default flags, "
        "from scratch and fine-tuned"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
