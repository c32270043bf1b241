"""FastWAM's inputs against LeRobot 0.6.1's: processor files, the camera video, VAE latents and text context.

Everything FastWAM does to a batch before its networks, without the networks (tools/interop/
fastwam_lerobot_interop.py checks those). Runs in two interpreters, like vla_processor_lerobot_interop.py:

    uv run python tools/interop/fastwam_processor_lerobot_interop.py --lerobot-python <LeRobot env python>

1. ours-write     (our env)     The tiny UMT5 tokenizer (packages/lerobot-cli/tests/umt5_tokenizer.py), a
                                seeded tiny Wan2.2 VAE and tiny UMT5 encoder saved with save_pretrained, our
                                pipelines (``fastwam_processor_steps``, toggles or not) saved with random
                                statistics, and our outputs on fixed inputs: pre/post-processed batches, the
                                camera video and inference image (video.py), latents / decoded pixels / the
                                training-video and inference-image latents in fp32 and bf16 (vae.py), text
                                contexts in fp32 and bf16 and the precomputed-context lookup (text.py,
                                contexts.py).
2. lerobot-check  (LeRobot env) LeRobot loads our pipeline files and recomputes our outputs; its own
                                ``make_fastwam_pre_post_processors`` with the same statistics must give the
                                same step lists (JSON) and outputs and is saved.
                                ``_stack_video_from_images`` / ``_input_image_from_batch``,
                                ``WanVideoVAE38`` with ``FastWAM.build_inputs`` /
                                ``_encode_input_image_latents_tensor`` / ``_decode_latents``' decode, and
                                ``WanTokenizer`` + ``WanTextEncoder`` with ``FastWAM.encode_prompt`` on our
                                saved tiny models recompute the rest. It also builds the tiny VAE and UMT5
                                from the same configs and seed and says whether the weights equal ours.
3. ours-check     (our env)     We load LeRobot's pipelines and recompute its outputs; the JSON files of both
                                sides are byte-equal and the normaliser state files hold equal tensors.

Tolerance: 0 (exact equality) for every tensor: both sides run the same operations in the same order and
dtypes on the CPU, so any difference is a bug (the measured differences are printed). Exit status 0 means
every comparison passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file
from safetensors.torch import save_file as _save_file

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_HELPER = REPO / "packages" / "lerobot-cli" / "tests" / "umt5_tokenizer.py"
SEED = 0
BATCH = 2
CHUNK = 8
MAX_LEN = 128  # LeRobot's tokenizer_max_len
IMAGE_SIZE = (32, 64)
MODEL_FRAMES = 5
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# name -> (feature type, shape), in the order both configs list them (the normaliser's JSON keeps it)
FEATURES = {
    "observation.images.top": ("VISUAL", (3, 32, 32)),
    "observation.images.wrist": ("VISUAL", (3, 32, 32)),
    "observation.state": ("STATE", (8,)),
    "action": ("ACTION", (7,)),
}
VARIANTS = {"plain": [], "toggle": [6], "toggle-negative": [-1, 0]}  # toggle_action_dimensions
TASKS = [
    "pick up the black bowl and place it on the plate",
    "open the top drawer",
    "a task long enough that the prompt template and it together are cut at the tokenizer's max length " * 2,
]
PROMPT_TEMPLATE = "A video recorded from a robot's point of view executing the following instruction: {task}"


def save_file(tensors: dict[str, torch.Tensor], path: str) -> None:
    """safetensors' save_file on contiguous copies (views and shared storage are refused there)."""
    _save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, path)


def report(tag: str, key: str, a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        print(f"[{tag}] {key}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype} MISMATCH")
        return False
    diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    ok = torch.equal(a, b)
    print(f"[{tag}] {key:44s} {a.dtype!s:14s} max|Δ| = {diff:.2e} {'equal' if ok else 'MISMATCH'}")
    return ok


def compare(tag: str, ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> bool:
    missing = sorted(set(ref) ^ set(got))
    if missing:
        print(f"[{tag}] keys differ: {missing}")
    results = [report(tag, key, ref[key], got[key]) for key in sorted(set(ref) & set(got))]  # print them all
    return all(results) and not missing


def make_stats(seed: int) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    stats = {}
    for key, (kind, shape) in FEATURES.items():
        shp = (shape[0], 1, 1) if kind == "VISUAL" else (shape[0],)
        stats[key] = {
            "mean": 0.2 * torch.randn(shp, generator=g),
            "std": 0.5 + torch.rand(shp, generator=g),
            "min": -1 - torch.rand(shp, generator=g),
            "max": 1 + torch.rand(shp, generator=g),
        }
    return stats


def make_inputs(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {
        k: torch.rand(BATCH, MODEL_FRAMES, *s, generator=g) for k, (t, s) in FEATURES.items() if t == "VISUAL"
    }
    out["observation.state"] = torch.randn(BATCH, 8, generator=g)
    out["action"] = torch.rand(BATCH, CHUNK, 7, generator=g)  # [0, 1]: the toggles see both sides of 0.5
    return out


def video_inputs(seed: int) -> dict[str, torch.Tensor]:
    """Two cameras at other sizes than their share, a pad mask, and one live frame per camera."""
    g = torch.Generator().manual_seed(seed)
    return {
        "temporal.observation.images.top": torch.rand(BATCH, MODEL_FRAMES, 3, 40, 60, generator=g),
        "temporal.observation.images.wrist": torch.rand(BATCH, MODEL_FRAMES, 3, 24, 24, generator=g),
        "temporal.observation.images.top_is_pad": torch.zeros(BATCH, MODEL_FRAMES, dtype=torch.bool),
        "single.observation.images.wrist": torch.rand(BATCH, 3, 48, 40, generator=g),
        "single.observation.images.top": torch.rand(BATCH, 3, 32, 32, generator=g),
        "input_image": torch.rand(3, 64, 128, generator=g),
    }


def split(inputs: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in inputs.items() if k.startswith(prefix)}


def vae_inputs(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "video": torch.rand(BATCH, 3, MODEL_FRAMES, *IMAGE_SIZE, generator=g),
        "image": torch.rand(1, 3, *IMAGE_SIZE, generator=g),
    }


def batch_tasks() -> list[str]:
    return [TASKS[2], TASKS[0], TASKS[0], TASKS[1]]


def tiny_tokenizer(work: Path) -> Path:
    directory = work / "tokenizer"
    if not (directory / "tokenizer.json").is_file():
        spec = importlib.util.spec_from_file_location("umt5_tokenizer", TOKENIZER_HELPER)
        helper = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(helper)
        helper.save_tiny_umt5_tokenizer(directory)
    return directory


def run_pipelines(pre, post, inputs: dict[str, torch.Tensor], tasks: list[str]) -> dict[str, torch.Tensor]:
    out = pre({**{k: v.clone() for k, v in inputs.items()}, "task": list(tasks)})
    assert list(out["task"]) == list(tasks), out["task"]
    result = {f"out.{k}": out[k].detach().clone() for k in inputs}
    result["out.post_action"] = post(out["action"].clone()).detach().clone()
    return result


# ---------------------------------------------------------------- our side (imports lerobot_cli)


def _our_config(toggle: list[int]):
    from typing import ClassVar

    from attrs import define, field
    from lerobot_cli.features import NormalizationMode, PolicyFeature
    from lerobot_cli.policies.config import PolicyConfig
    from lerobot_cli.policies.spec import PolicySpec

    @define(frozen=True, kw_only=True)
    class FastWAMProcessorConfig(PolicyConfig):
        """FastWAM's normalisation mapping and the field its step lists read (the networks are not needed)."""

        type: ClassVar[str] = "fastwam_processor_interop"
        spec: ClassVar[PolicySpec] = PolicySpec(
            model="lerobot_cli.policies.fastwam.modeling:Unused",
            processors="lerobot_cli.policies.fastwam.processors:fastwam_processor_steps",
        )
        normalization_mapping: dict = field(
            factory=lambda: {
                "VISUAL": NormalizationMode.IDENTITY,
                "STATE": NormalizationMode.MEAN_STD,
                "ACTION": NormalizationMode.MEAN_STD,
            }
        )
        toggle_action_dimensions: list = field(factory=list)

    feats = {k: PolicyFeature(type=t, shape=s) for k, (t, s) in FEATURES.items()}
    return FastWAMProcessorConfig(
        input_features={k: f for k, f in feats.items() if k != "action"},
        output_features={"action": feats["action"]},
        device="cpu",
        toggle_action_dimensions=toggle,
    )


def ours_write(work: Path) -> None:
    import lerobot_cli.policies.fastwam.processors  # noqa: F401 - registers the toggle step
    from lerobot_cli.policies.fastwam import video as ours_video
    from lerobot_cli.policies.fastwam.contexts import precompute_task_contexts
    from lerobot_cli.policies.fastwam.text import (
        PromptEncoder,
        batch_prompts,
        build_umt5_encoder,
        load_umt5_encoder,
        load_umt5_tokenizer,
        tiny_umt5_config,
    )
    from lerobot_cli.policies.fastwam.vae import build_wan_vae, load_wan_vae, tiny_wan_vae_config
    from lerobot_cli.processors import make_pre_post_processors, save_processors

    for variant, toggle in VARIANTS.items():
        pre, post = make_pre_post_processors(_our_config(toggle), make_stats(2))
        out = work / f"ours_{variant}"
        save_processors(pre, post, out)
        inputs = make_inputs(3)
        save_file(
            {**{f"in.{k}": v for k, v in inputs.items()}, **run_pipelines(pre, post, inputs, TASKS[:BATCH])},
            str(out / "reference.safetensors"),
        )
        (work / f"ours_{variant}_steps.json").write_text(
            json.dumps({"pre": pre.get_config(), "post": post.get_config()}, indent=2)
        )

    inputs = video_inputs(4)
    temporal, single = split(inputs, "temporal."), split(inputs, "single.")
    kw = {"image_size": IMAGE_SIZE, "model_video_frames": MODEL_FRAMES}
    video_out = {
        "out.temporal": ours_video.stack_video(temporal, **kw),
        "out.single": ours_video.stack_video(single, **kw),
        "out.first_frame": ours_video.inference_image(temporal, **kw),
        "out.input_image": ours_video.inference_image({**single, "input_image": inputs["input_image"]}, **kw),
    }
    save_file({**{f"in.{k}": v for k, v in inputs.items()}, **video_out}, str(work / "video.safetensors"))

    config = tiny_wan_vae_config()
    (work / "vae_config.json").write_text(json.dumps(config))
    torch.manual_seed(SEED)
    build_wan_vae(config).autoencoder.save_pretrained(str(work / "vae"))
    pixels = vae_inputs(5)
    vae_out = {}
    for name, dtype in DTYPES.items():
        vae = load_wan_vae(work / "vae", dtype=dtype)
        latents = vae.encode_video(pixels["video"])
        vae_out[f"{name}.latents"] = latents
        vae_out[f"{name}.decoded"] = vae.decode(latents)
        vae_out[f"{name}.image_latents"] = vae.encode_image(pixels["image"])
    save_file({**{f"in.{k}": v for k, v in pixels.items()}, **vae_out}, str(work / "vae_ours.safetensors"))

    text_config = tiny_umt5_config()
    (work / "umt5_config.json").write_text(json.dumps(text_config))
    torch.manual_seed(SEED)
    build_umt5_encoder(text_config).save_pretrained(str(work / "umt5"))
    tokenizer = load_umt5_tokenizer(tiny_tokenizer(work))
    tasks = batch_tasks()
    prompts = batch_prompts({"task": tasks}, PROMPT_TEMPLATE)
    text_out = {}
    for name, dtype in DTYPES.items():
        encoder = PromptEncoder(tokenizer, load_umt5_encoder(work / "umt5", dtype=dtype), MAX_LEN)
        text_out[f"{name}.context"], text_out[f"{name}.mask"] = encoder.encode(prompts)
        table = precompute_task_contexts(TASKS, encoder, template=PROMPT_TEMPLATE, batch_size=1)
        text_out[f"{name}.precomputed"], text_out[f"{name}.precomputed_mask"] = table.lookup(tasks)
    save_file(text_out, str(work / "text_ours.safetensors"))
    (work / "prompts.json").write_text(json.dumps({"tasks": tasks, "prompts": prompts}, indent=2))
    print(f"[ours-write] wrote {work}")


def ours_check(work: Path) -> bool:
    import lerobot_cli.policies.fastwam.processors  # noqa: F401 - registers the toggle step
    from lerobot_cli.processors import load_processors

    ok = True
    for variant in VARIANTS:
        src = work / f"lerobot_{variant}"
        pre, post = load_processors(src)
        data = load_file(str(src / "reference.safetensors"))
        inputs = {k[3:]: v for k, v in data.items() if k.startswith("in.")}
        ok &= compare(
            f"ours<-lerobot {variant}",
            {k: v for k, v in data.items() if k.startswith("out.")},
            run_pipelines(pre, post, inputs, TASKS[:BATCH]),
        )
        same_stats = work / f"lerobot_{variant}_same_stats"
        for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
            same = (same_stats / name).read_bytes() == (work / f"ours_{variant}" / name).read_bytes()
            print(f"[ours vs lerobot {variant}] {name} {'byte-equal' if same else 'DIFFERS'}")
            ok &= same
        for state in sorted(p.name for p in same_stats.glob("*.safetensors")):
            ok &= _state_files_agree(
                f"ours vs lerobot {variant}", same_stats, work / f"ours_{variant}", state
            )
    return ok


def _state_files_agree(tag: str, theirs_dir: Path, ours_dir: Path, state: str) -> bool:
    """A normaliser's statistics file: every tensor we write equals LeRobot's. LeRobot's unnormaliser also
    stores the statistics of features it never touches (it is given the whole dataset's, our factory keeps
    the output features'): such extra keys are listed, and any other difference fails."""
    if not (ours_dir / state).is_file():
        print(f"[{tag}] {state}: we wrote no such file")
        return False
    theirs, ours = load_file(str(theirs_dir / state)), load_file(str(ours_dir / state))
    pipeline = (
        "policy_postprocessor.json"
        if state.startswith("policy_postprocessor")
        else "policy_preprocessor.json"
    )
    step = next(
        s for s in json.loads((theirs_dir / pipeline).read_text())["steps"] if s.get("state_file") == state
    )
    features = set(step["config"]["features"])
    extra = sorted(set(theirs) - set(ours))
    unused = [k for k in extra if k.rsplit(".", 1)[0] not in features]
    ok = not set(ours) - set(theirs) and unused == extra
    results = [report(f"{tag} {state}", key, theirs[key], ours[key]) for key in sorted(ours) if key in theirs]
    ok &= all(results)
    if unused:
        print(
            f"[{tag}] {state}: LeRobot also stores {len(unused)} statistics of features the step never uses "
            f"({', '.join(sorted({k.rsplit('.', 1)[0] for k in unused}))}); the ones it reads are equal"
        )
    if extra != unused or set(ours) - set(theirs):
        print(
            f"[{tag}] {state}: keys MISMATCH: only LeRobot's {sorted(set(extra) - set(unused))}, "
            f"only ours {sorted(set(ours) - set(theirs))}"
        )
    same = (ours_dir / state).read_bytes() == (theirs_dir / state).read_bytes()
    print(f"[{tag}] {state} {'byte-equal' if same else 'bytes differ (keys above)'}")
    return ok


# ---------------------------------------------------------------- LeRobot side (imports lerobot)


def _lerobot_config(toggle: list[int]):
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.fastwam.configuration_fastwam import FastWAMConfig

    feats = {k: PolicyFeature(type=FeatureType[t], shape=s) for k, (t, s) in FEATURES.items()}
    return FastWAMConfig(
        input_features={k: f for k, f in feats.items() if k != "action"},
        output_features={"action": feats["action"]},
        device="cpu",
        action_dim=7,
        proprio_dim=8,
        image_size=IMAGE_SIZE,
        toggle_action_dimensions=toggle,
        base_model_id=None,
    )


def _lerobot_load(src: Path):
    import lerobot.policies.fastwam.processor_fastwam  # noqa: F401 - registers the toggle step
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action

    pre = PolicyProcessorPipeline.from_pretrained(str(src), "policy_preprocessor.json")
    post = PolicyProcessorPipeline.from_pretrained(
        str(src),
        "policy_postprocessor.json",
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    return pre, post


def _step_lists_equal(tag: str, ours: dict, theirs: dict) -> bool:
    ok = True
    for side in ("pre", "post"):
        if ours[side] == theirs[side]:
            print(
                f"[{tag}] {side}processor JSON equal: "
                f"{' → '.join(s['registry_name'] for s in ours[side]['steps'])}"
            )
            continue
        ok = False
        print(
            f"[{tag}] {side}processor JSON MISMATCH\n    ours    {json.dumps(ours[side])}\n"
            f"    LeRobot {json.dumps(theirs[side])}"
        )
    return ok


def lerobot_processors(work: Path) -> bool:
    from lerobot.policies.fastwam.processor_fastwam import make_fastwam_pre_post_processors

    ok = True
    for variant, toggle in VARIANTS.items():
        src = work / f"ours_{variant}"
        pre, post = _lerobot_load(src)
        data = load_file(str(src / "reference.safetensors"))
        inputs = {k[3:]: v for k, v in data.items() if k.startswith("in.")}
        ref = {k: v for k, v in data.items() if k.startswith("out.")}
        ok &= compare(f"lerobot<-ours {variant}", ref, run_pipelines(pre, post, inputs, TASKS[:BATCH]))

        config = _lerobot_config(toggle)
        pre, post = make_fastwam_pre_post_processors(
            config, dataset_stats=make_stats(2)
        )  # ours_write's statistics
        theirs = json.loads(json.dumps({"pre": pre.get_config(), "post": post.get_config()}))
        ours = json.loads((work / f"ours_{variant}_steps.json").read_text())
        ok &= _step_lists_equal(f"lerobot vs ours {variant}", ours, theirs)
        ok &= compare(
            f"lerobot's own vs ours {variant}", ref, run_pipelines(pre, post, inputs, TASKS[:BATCH])
        )
        pre.save_pretrained(str(work / f"lerobot_{variant}_same_stats"))
        post.save_pretrained(str(work / f"lerobot_{variant}_same_stats"))

        pre, post = make_fastwam_pre_post_processors(config, dataset_stats=make_stats(10))
        out = work / f"lerobot_{variant}"
        pre.save_pretrained(str(out))
        post.save_pretrained(str(out))
        inputs = make_inputs(13)
        save_file(
            {**{f"in.{k}": v for k, v in inputs.items()}, **run_pipelines(pre, post, inputs, TASKS[:BATCH])},
            str(out / "reference.safetensors"),
        )
    return ok


def lerobot_video(work: Path) -> bool:
    from lerobot.policies.fastwam.modeling_fastwam import _input_image_from_batch, _stack_video_from_images

    data = load_file(str(work / "video.safetensors"))
    inputs = {k[3:]: v for k, v in data.items() if k.startswith("in.")}
    temporal, single = split(inputs, "temporal."), split(inputs, "single.")
    config = SimpleNamespace(image_size=IMAGE_SIZE, model_video_frames=MODEL_FRAMES)
    got = {
        "out.temporal": _stack_video_from_images(temporal, config),
        "out.single": _stack_video_from_images(single, config),
        "out.first_frame": _input_image_from_batch(temporal, config),
        "out.input_image": _input_image_from_batch({**single, "input_image": inputs["input_image"]}, config),
    }
    return compare("lerobot video", {k: v for k, v in data.items() if k.startswith("out.")}, got)


def _weights_equal(tag: str, ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    """Informational: whether the same config and seed give the same weights on both sides' torch."""
    same = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    print(
        f"[{tag}] built from the same config and seed {SEED}: weights {'equal' if same else 'DIFFER'} "
        f"({len(theirs)} tensors)"
    )


def lerobot_vae(work: Path) -> bool:
    from diffusers import AutoencoderKLWan
    from lerobot.policies.fastwam.wan import FastWAM, WanVideoVAE38

    config = json.loads((work / "vae_config.json").read_text())
    torch.manual_seed(SEED)
    _weights_equal(
        "lerobot vae",
        AutoencoderKLWan.from_pretrained(str(work / "vae")).state_dict(),
        AutoencoderKLWan(**config).state_dict(),
    )
    data = load_file(str(work / "vae_ours.safetensors"))
    got = {}
    for name, dtype in DTYPES.items():
        vae = WanVideoVAE38(
            dtype=dtype,
            device="cpu",
            pretrained=AutoencoderKLWan.from_pretrained(str(work / "vae"), torch_dtype=dtype),
        )
        model = SimpleNamespace(
            vae=vae,
            device=torch.device("cpu"),
            torch_dtype=dtype,
            video_expert=SimpleNamespace(),
            proprio_encoder=None,
        )
        model._encode_video_latents = FastWAM._encode_video_latents.__get__(model)
        sample = {
            "video": data["in.video"],
            "action": torch.zeros(BATCH, 4 * (MODEL_FRAMES - 1), 7),
            "context": torch.zeros(BATCH, 4, 32),
            "context_mask": torch.ones(BATCH, 4, dtype=torch.bool),
        }
        latents = FastWAM.build_inputs(model, sample)["input_latents"]  # the training path: cast, map, encode
        got[f"{name}.latents"] = latents
        got[f"{name}.decoded"] = vae.decode(latents)  # what _decode_latents decodes (before its uint8 frames)
        got[f"{name}.image_latents"] = FastWAM._encode_input_image_latents_tensor(model, data["in.image"])
    return compare("lerobot vae", {k: v for k, v in data.items() if not k.startswith("in.")}, got)


def lerobot_text(work: Path) -> bool:
    from lerobot.policies.fastwam.modeling_fastwam import _prompt_from_batch
    from lerobot.policies.fastwam.wan import FastWAM
    from lerobot.policies.fastwam.wan.components import WanTextEncoder, WanTokenizer
    from transformers import UMT5Config, UMT5EncoderModel

    config = json.loads((work / "umt5_config.json").read_text())
    torch.manual_seed(SEED)
    _weights_equal(
        "lerobot umt5",
        UMT5EncoderModel.from_pretrained(str(work / "umt5")).state_dict(),
        UMT5EncoderModel(UMT5Config(**config)).state_dict(),
    )
    names = json.loads((work / "prompts.json").read_text())
    prompts = _prompt_from_batch({"task": names["tasks"]}, SimpleNamespace(prompt_template=PROMPT_TEMPLATE))
    ok = prompts == names["prompts"]
    print(f"[lerobot text] prompts {'equal' if ok else f'MISMATCH: {prompts!r}'}")
    data = load_file(str(work / "text_ours.safetensors"))
    got = {}
    for name, dtype in DTYPES.items():
        encoder = WanTextEncoder(
            dtype=dtype,
            device="cpu",
            pretrained=UMT5EncoderModel.from_pretrained(str(work / "umt5"), dtype=dtype),
        )
        model = SimpleNamespace(
            text_encoder=encoder,
            tokenizer=WanTokenizer(str(work / "tokenizer"), MAX_LEN),
            device=torch.device("cpu"),
        )
        got[f"{name}.context"], got[f"{name}.mask"] = FastWAM.encode_prompt(model, prompts)
        got[f"{name}.precomputed"], got[f"{name}.precomputed_mask"] = (
            got[f"{name}.context"],
            got[f"{name}.mask"],
        )
    return compare("lerobot text", data, got) and ok


def lerobot_check(work: Path) -> bool:
    results = [lerobot_processors(work), lerobot_video(work), lerobot_vae(work), lerobot_text(work)]
    return all(results)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "mode", nargs="?", default="run", choices=["run", "ours-write", "ours-check", "lerobot-check"]
    )
    parser.add_argument("dir", nargs="?", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument(
        "--lerobot-python",
        default="/tmp/lerobot-venv/bin/python",
        help="interpreter of the environment where LeRobot is installed",
    )
    args = parser.parse_args()
    if args.mode == "ours-write":
        ours_write(args.dir)
        return 0
    if args.mode == "ours-check":
        return 0 if ours_check(args.dir) else 1
    if args.mode == "lerobot-check":
        return 0 if lerobot_check(args.dir) else 1
    work = args.dir or Path(tempfile.mkdtemp(prefix="fastwam-processor-interop-"))
    work.mkdir(parents=True, exist_ok=True)
    ours_write(work)
    lerobot = subprocess.run(
        [args.lerobot_python, str(Path(__file__).resolve()), "lerobot-check", str(work)], check=False
    )
    lerobot_ok = lerobot.returncode == 0
    ours_ok = ours_check(work)
    print(
        f"LeRobot matches ours: {'PASS' if lerobot_ok else 'FAIL'}; "
        f"we match LeRobot's: {'PASS' if ours_ok else 'FAIL'}"
    )
    return 0 if lerobot_ok and ours_ok else 1


if __name__ == "__main__":
    sys.exit(main())
