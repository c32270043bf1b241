"""Check that pi0/pi05/SmolVLA processor pipelines cross between this trainer and LeRobot 0.6.1, both ways.

The language half of pi0/pi05 (newline, pi05's state-in-prompt, tokenizer, relative actions, quantile
normalization), without the models. The tokenizer is the tiny byte-level one the unit tests build
(packages/lerobot-cli/tests/vla_tokenizer.py), saved to a local directory and named as the tokenizer, so
nothing is downloaded. Like act_lerobot_interop.py it runs in two interpreters:

    uv run python tools/interop/vla_processor_lerobot_interop.py --lerobot-python /tmp/lerobot-venv/bin/python

1. ours-write     (our env)     the tiny tokenizer; pi0/pi05 pipelines from our step lists
                                (``lerobot_cli.policies.pi0.processors``, ``…pi05.processors``) with random
                                statistics, saved; a task batch and our outputs recorded next to them.
2. lerobot-check  (LeRobot env) ``PolicyProcessorPipeline.from_pretrained(dir, "policy_preprocessor.json")``
                                (and the postprocessor) on our directory: same prompts, tokens, masks,
                                normalised tensors and unnormalised actions. Then LeRobot's own
                                ``make_pi0_pre_post_processors`` / ``make_pi05_…`` (its hard-coded PaliGemma
                                name pointed at the tiny tokenizer): their step lists and JSON configs must
                                equal ours; that pipeline is saved with its own reference outputs.
3. ours-check     (our env)     ``load_processors`` on LeRobot's directory, compared the same way; the
                                two sides' pipeline JSON files must be byte-equal.

Variants: "pi0" (MEAN_STD), "pi05" (QUANTILES, state tokens in the prompt), "pi0-relative" (relative
actions on, a gripper joint kept absolute), "smolvla" (its newline step, ``longest`` padding, the tokenizer
of ``vlm_model_name``), "smolvla-max-length" (``pad_language_to=max_length``). Exit status 0 means every
comparison passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_HELPER = REPO / "packages" / "lerobot-cli" / "tests" / "vla_tokenizer.py"
PALIGEMMA = "google/paligemma-3b-pt-224"
ATOL = 1e-6
BATCH = 4
CHUNK = 5
# name -> (feature type, shape)
FEATURES = {
    "observation.state": ("STATE", (6,)),
    "observation.images.top": ("VISUAL", (3, 8, 8)),
    "action": ("ACTION", (4,)),
}
ACTION_NAMES = ["x", "y", "z", "gripper"]
TASKS = [
    "pick_up the red cube",
    "Move the blue dot onto the red target.\n",
    "  stack\nthe cups  ",
    "a task long enough to be cut by the tokenizer's max length, twice over",
]
# variant -> (policy, our config's overrides); the same settings are given to LeRobot's config
VARIANTS = {
    "pi0": ("pi0", {"tokenizer_max_length": 32}),
    "pi05": ("pi05", {"tokenizer_max_length": 96}),
    "pi0-relative": (
        "pi0",
        {"tokenizer_max_length": 32, "use_relative_actions": True, "action_feature_names": ACTION_NAMES},
    ),
    # SmolVLA: LeRobot's own config class on both sides; vlm_model_name names the tiny tokenizer's directory
    "smolvla": ("smolvla", {"tokenizer_max_length": 32}),
    "smolvla-max-length": ("smolvla", {"tokenizer_max_length": 32, "pad_language_to": "max_length"}),
}
COMPARED = (
    "observation.language.tokens",
    "observation.language.attention_mask",
    "observation.state",
    "observation.images.top",
    "action",
)


def make_stats(seed: int) -> dict[str, dict[str, torch.Tensor]]:
    """Every statistic LeRobot's datasets carry, quantiles included (pi05 normalizes with q01/q99)."""
    g = torch.Generator().manual_seed(seed)
    stats = {}
    for key, (kind, shape) in FEATURES.items():
        shp = (shape[0], 1, 1) if kind == "VISUAL" else (shape[0],)
        low = -1 - torch.rand(shp, generator=g)
        high = 1 + torch.rand(shp, generator=g)
        stats[key] = {
            "mean": 0.2 * torch.randn(shp, generator=g),
            "std": 0.5 + torch.rand(shp, generator=g),
            "min": low - 0.5,
            "max": high + 0.5,
            "q01": low,
            "q10": low / 2,
            "q50": 0 * low,
            "q90": high / 2,
            "q99": high,
        }
    return stats


def make_inputs(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.state": 1.5 * torch.randn(BATCH, 6, generator=g),
        "observation.images.top": torch.rand(BATCH, 3, 8, 8, generator=g),
        "action": torch.randn(BATCH, CHUNK, 4, generator=g),
    }


def tiny_tokenizer(work: Path) -> Path:
    directory = work / "tokenizer"
    if not (directory / "tokenizer.json").is_file():
        spec = importlib.util.spec_from_file_location("vla_tokenizer", TOKENIZER_HELPER)
        helper = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(helper)
        helper.save_tiny_tokenizer(directory)
    return directory


def run_pipelines(pre, post, inputs: dict[str, torch.Tensor], tasks: list[str]) -> tuple[dict, list[str]]:
    """Pre-processor on a training batch, post-processor on its (normalised) action: tensors and prompts."""
    out = pre({**{k: v.clone() for k, v in inputs.items()}, "task": list(tasks)})
    result = {f"out.{k}": out[k].detach().clone() for k in COMPARED}
    result["out.post_action"] = post(out["action"].clone()).detach().clone()
    return result, list(out["task"])


def save_reference(directory: Path, inputs: dict, outputs: dict, prompts: list[str]) -> None:
    save_file(
        {
            **{f"in.{k}": v.contiguous() for k, v in inputs.items()},
            **{k: v.contiguous() for k, v in outputs.items()},
        },
        str(directory / "reference.safetensors"),
    )
    (directory / "reference.json").write_text(json.dumps({"tasks": TASKS, "prompts": prompts}, indent=2))


def load_reference(directory: Path) -> tuple[dict, dict, list[str]]:
    data = load_file(str(directory / "reference.safetensors"))
    inputs = {k[3:]: v for k, v in data.items() if k.startswith("in.")}
    return (
        inputs,
        {k: v for k, v in data.items() if k.startswith("out.")},
        json.loads((directory / "reference.json").read_text())["prompts"],
    )


def compare(tag: str, ref: dict, got: dict, ref_prompts: list[str], got_prompts: list[str]) -> bool:
    ok = ref_prompts == got_prompts
    print(f"[{tag}] prompts {'equal' if ok else f'MISMATCH: {ref_prompts!r} vs {got_prompts!r}'}")
    for key in sorted(ref):
        a, b = ref[key], got[key]
        if a.shape != b.shape or a.dtype != b.dtype:
            print(f"[{tag}] {key}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype} MISMATCH")
            ok = False
            continue
        diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        good = diff == 0 if not a.is_floating_point() else diff <= ATOL * max(1.0, a.abs().max().item())
        ok &= good
        print(f"[{tag}] {key:42s} {a.dtype!s:14s} max|Δ| = {diff:.2e} {'ok' if good else 'MISMATCH'}")
    return ok


# ---------------------------------------------------------------- our side (imports lerobot_cli)


def _our_config(variant: str, tokenizer: Path):
    from typing import ClassVar

    from attrs import define, field
    from lerobot_cli.features import NormalizationMode, PolicyFeature
    from lerobot_cli.policies.config import PolicyConfig
    from lerobot_cli.policies.spec import PolicySpec

    policy, overrides = VARIANTS[variant]
    quantiles = policy == "pi05"
    if policy == "smolvla":
        from lerobot_cli.policies.smolvla.config import SmolVLAConfig

        feats = {k: PolicyFeature(type=t, shape=s) for k, (t, s) in FEATURES.items()}
        return SmolVLAConfig(
            input_features={k: f for k, f in feats.items() if k != "action"},
            output_features={"action": feats["action"]},
            device="cpu",
            vlm_model_name=str(tokenizer),
            **overrides,
        )

    @define(frozen=True, kw_only=True)
    class VlaProcessorConfig(PolicyConfig):
        """The fields the step lists read, with LeRobot's pi0/pi05 defaults (the model is not needed)."""

        type: ClassVar[str] = f"{policy}_processor_interop"
        spec: ClassVar[PolicySpec] = PolicySpec(
            model=f"lerobot_cli.policies.{policy}.modeling:Unused",
            processors=f"lerobot_cli.policies.{policy}.processors:{policy}_processor_steps",
        )
        normalization_mapping: dict = field(
            factory=lambda: {
                "VISUAL": NormalizationMode.IDENTITY,
                "STATE": NormalizationMode.QUANTILES if quantiles else NormalizationMode.MEAN_STD,
                "ACTION": NormalizationMode.QUANTILES if quantiles else NormalizationMode.MEAN_STD,
            }
        )
        tokenizer_name: str = PALIGEMMA
        tokenizer_max_length: int = 48
        max_state_dim: int = 32
        use_relative_actions: bool = False
        relative_exclude_joints: list = field(factory=lambda: ["gripper"])
        action_feature_names: list | None = None

    feats = {k: PolicyFeature(type=t, shape=s) for k, (t, s) in FEATURES.items()}
    return VlaProcessorConfig(
        input_features={k: f for k, f in feats.items() if k != "action"},
        output_features={"action": feats["action"]},
        device="cpu",
        tokenizer_name=str(tokenizer),
        **overrides,
    )


def ours_write(work: Path, variant: str) -> None:
    from lerobot_cli.processors import make_pre_post_processors, save_processors

    pre, post = make_pre_post_processors(_our_config(variant, tiny_tokenizer(work)), make_stats(2))
    out = work / f"ours_{variant}"
    save_processors(pre, post, out)
    inputs = make_inputs(3)
    outputs, prompts = run_pipelines(pre, post, inputs, TASKS)
    save_reference(out, inputs, outputs, prompts)
    (work / f"ours_{variant}_steps.json").write_text(
        json.dumps({"pre": pre.get_config(), "post": post.get_config()}, indent=2)
    )
    print(f"[ours-write] wrote {out}")


def ours_check(work: Path, variant: str) -> bool:
    from lerobot_cli.processors import load_processors

    src = work / f"lerobot_{variant}"
    pre, post = load_processors(src)
    inputs, ref, ref_prompts = load_reference(src)
    got, prompts = run_pipelines(pre, post, inputs, TASKS)
    ok = compare(f"ours<-lerobot {variant}", ref, got, ref_prompts, prompts)
    for name in (
        "policy_preprocessor.json",
        "policy_postprocessor.json",
    ):  # no statistics in them: same bytes
        same = (src / name).read_bytes() == (work / f"ours_{variant}" / name).read_bytes()
        print(f"[ours vs lerobot {variant}] {name} {'byte-equal' if same else 'DIFFERS'}")
        ok &= same
    return ok


# ---------------------------------------------------------------- LeRobot side (imports lerobot)


def _lerobot_load(src: Path):
    from lerobot.policies.factory import _reconnect_relative_absolute_steps
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action

    pre = PolicyProcessorPipeline.from_pretrained(str(src), "policy_preprocessor.json")
    post = PolicyProcessorPipeline.from_pretrained(
        str(src),
        "policy_postprocessor.json",
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    _reconnect_relative_absolute_steps(pre, post)
    return pre, post


def _lerobot_make(variant: str, tokenizer: Path, seed: int):
    """LeRobot's own pi0/pi05 pipelines; its processor names PaliGemma's tokenizer, which is pointed at
    the tiny one while the step loads and then renamed to that directory, so the saved file is usable."""
    import lerobot.processor.tokenizer_processor as tokenizer_module
    from lerobot.configs.types import FeatureType, PolicyFeature

    policy, overrides = VARIANTS[variant]
    if policy == "smolvla":  # its tokenizer is vlm_model_name's: the tiny tokenizer's directory
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig as Config
        from lerobot.policies.smolvla.processor_smolvla import make_smolvla_pre_post_processors as make

        overrides = {**overrides, "vlm_model_name": str(tokenizer)}
    elif policy == "pi05":
        from lerobot.policies.pi05.configuration_pi05 import PI05Config as Config
        from lerobot.policies.pi05.processor_pi05 import make_pi05_pre_post_processors as make
    else:
        from lerobot.policies.pi0.configuration_pi0 import PI0Config as Config
        from lerobot.policies.pi0.processor_pi0 import make_pi0_pre_post_processors as make

    feats = {k: PolicyFeature(type=FeatureType[t], shape=s) for k, (t, s) in FEATURES.items()}
    cfg = Config(
        input_features={k: f for k, f in feats.items() if k != "action"},
        output_features={"action": feats["action"]},
        device="cpu",
        **overrides,
    )
    real = tokenizer_module.AutoTokenizer

    class _TinyInsteadOfPaligemma:
        @staticmethod
        def from_pretrained(name, *args, **kwargs):
            return real.from_pretrained(str(tokenizer) if name == PALIGEMMA else name, *args, **kwargs)

    tokenizer_module.AutoTokenizer = _TinyInsteadOfPaligemma
    try:
        pre, post = make(cfg, dataset_stats=make_stats(seed))
    finally:
        tokenizer_module.AutoTokenizer = real
    for step in pre.steps:
        if getattr(step, "tokenizer_name", None) == PALIGEMMA:
            step.tokenizer_name = str(tokenizer)
    return pre, post


def _step_lists_equal(tag: str, ours: dict, theirs: dict) -> bool:
    ok = True
    for side in ("pre", "post"):
        if ours[side] == theirs[side]:
            names = [s["registry_name"] for s in ours[side]["steps"]]
            print(f"[{tag}] {side}processor JSON equal: {' → '.join(names)}")
            continue
        ok = False
        print(f"[{tag}] {side}processor JSON MISMATCH")
        for a, b in zip(ours[side]["steps"], theirs[side]["steps"], strict=False):
            if a != b:
                print(f"    ours    {json.dumps(a)}\n    LeRobot {json.dumps(b)}")
        if len(ours[side]["steps"]) != len(theirs[side]["steps"]):
            print(f"    {len(ours[side]['steps'])} steps here, {len(theirs[side]['steps'])} in LeRobot's")
    return ok


def lerobot_check(work: Path, variant: str) -> bool:
    src = work / f"ours_{variant}"
    pre, post = _lerobot_load(src)
    inputs, ref, ref_prompts = load_reference(src)
    got, prompts = run_pipelines(pre, post, inputs, TASKS)
    ok = compare(f"lerobot<-ours {variant}", ref, got, ref_prompts, prompts)

    tokenizer = work / "tokenizer"
    pre, post = _lerobot_make(variant, tokenizer, 2)  # the statistics ours_write used: same JSON and state
    theirs = json.loads(json.dumps({"pre": pre.get_config(), "post": post.get_config()}))  # as in the files
    ours = json.loads((work / f"ours_{variant}_steps.json").read_text())
    ok = _step_lists_equal(f"lerobot vs ours {variant}", ours, theirs) and ok
    got, prompts = run_pipelines(pre, post, inputs, TASKS)
    ok = compare(f"lerobot's own vs ours {variant}", ref, got, ref_prompts, prompts) and ok

    pre, post = _lerobot_make(variant, tokenizer, 10)
    out = work / f"lerobot_{variant}"
    pre.save_pretrained(str(out))
    post.save_pretrained(str(out))
    inputs = make_inputs(13)
    outputs, prompts = run_pipelines(pre, post, inputs, TASKS)
    save_reference(out, inputs, outputs, prompts)
    print(f"[lerobot-check] wrote {out}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "mode", nargs="?", default="run", choices=["run", "ours-write", "ours-check", "lerobot-check"]
    )
    parser.add_argument("dir", nargs="?", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument(
        "--variant", choices=sorted(VARIANTS), action="append", help="variant(s) to check (default: all)"
    )
    parser.add_argument(
        "--lerobot-python",
        default="/tmp/lerobot-venv/bin/python",
        help="interpreter of the environment where LeRobot is installed",
    )
    args = parser.parse_args()
    variants = args.variant or sorted(VARIANTS)
    if args.mode == "ours-write":
        for v in variants:
            ours_write(args.dir, v)
        return 0
    if args.mode == "ours-check":
        results = [ours_check(args.dir, v) for v in variants]  # run every variant, then judge
        return 0 if all(results) else 1
    if args.mode == "lerobot-check":
        results = [lerobot_check(args.dir, v) for v in variants]
        return 0 if all(results) else 1
    work = args.dir or Path(tempfile.mkdtemp(prefix="vla-processor-interop-"))
    work.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())
    for v in variants:
        ours_write(work, v)
    flags = [arg for v in variants for arg in ("--variant", v)]
    lerobot = subprocess.run([args.lerobot_python, me, "lerobot-check", str(work), *flags], check=False)
    lerobot_ok = lerobot.returncode == 0
    ours_ok = all([ours_check(work, v) for v in variants])  # noqa: C419 - check every variant
    print(
        f"LeRobot loads ours: {'PASS' if lerobot_ok else 'FAIL'}; we load LeRobot's: "
        f"{'PASS' if ours_ok else 'FAIL'}"
    )
    return 0 if lerobot_ok and ours_ok else 1


if __name__ == "__main__":
    sys.exit(main())
