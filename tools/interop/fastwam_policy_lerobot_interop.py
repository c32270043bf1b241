"""Our whole FastWAM policy against LeRobot 0.6.1's: files both ways, the training loss, its parts, every
gradient, and the action chunks.

LeRobot needs its own environment (Python 3.12, lerobot 0.6.1 with diffusers and transformers), so this
script runs in two interpreters and hands files between them:

    uv run python tools/interop/fastwam_policy_lerobot_interop.py --lerobot-python <LeRobot env python>

1. ours-write     (our env)      The frozen parts both sides load: a tiny Wan2.2-shaped VAE (diffusers'
                                 ``save_pretrained``), a tiny UMT5 encoder (transformers' ``save_pretrained``:
                                 the weights travel as files, transformers 5.24 and 5.5 initialise
                                 differently) and a byte-level UMT5 tokenizer this check writes
                                 (packages/lerobot-cli/tests/umt5_tokenizer.py). Per case: our ``config.json``
                                 (+ sidecar), a seeded policy saved as ``model.safetensors``, a training batch
                                 and a live batch, and our outputs on them as reference.
2. lerobot-check  (LeRobot env)  LeRobot's ``FastWAMPolicy.from_pretrained(<our directory>, strict=True)``,
                                 its three frozen-part loaders pointed at those files (its code otherwise
                                 untouched), recomputes our reference: ``forward`` (its
                                 ``_batch_to_training_sample`` + ``training_loss``) under the same seed, then
                                 ``backward``, and ``predict_action_chunk`` (its ``infer_action`` per sample).
                                 Then a policy seeded on its side, written by its own ``save_pretrained``,
                                 with its outputs.
3. ours-check     (our env)      That directory: its ``config.json`` read by our serializer, its weights
                                 loaded into our policy strictly (our ``load_weights``), our outputs equal
                                 LeRobot's.

Outputs compared per case (fp32 and bf16, CPU), each with ``torch.equal``:

* ``loss``, ``loss_video``, ``loss_action``: the training loss of one batch (2 samples: cameras of other
  sizes resized and concatenated, the prompt template around each task through UMT5, the state's frame 0 as
  the proprio token, padded action steps) and its parts as LeRobot logs them (lambda-weighted; LeRobot hands
  Python floats, ours 0-d tensors: compared in float64, where the lambdas 0.5/1/2 multiply exactly);
* ``draw.*``: the four draws of the step (video noise, video timesteps, action noise, action timesteps),
  recorded on both sides from the same seed (the batches carry no dataset ``index``: with one, ours draws
  per sample for layout-independent losses, as pi0's does, where LeRobot draws from the global RNG);
  LeRobot's side then replays ours (as fastwam_flow_lerobot_interop.py does for bf16), so the loss compares
  what each draw is used for even if a torch version drew other numbers;
* ``grad.*``: the gradient of every trainable parameter (``loss.backward()``);
* ``chunk``: ``predict_action_chunk`` on a live batch of 2 (the first frame, prefill, Euler steps; seeded
  noise, every sample re-seeded as LeRobot does), float32.

Tolerance: 0. Both sides run the same operations in the same order and dtypes (the VAE's and UMT5's numbers
are already bit-equal in fastwam_processor_lerobot_interop.py, the networks' in fastwam_lerobot_interop.py,
the schedule and losses in fastwam_flow_lerobot_interop.py), so a difference is a bug, not rounding. Inputs
read back from safetensors are cloned first (``load_inputs``): an mmap'd tensor's address changes how CPU
kernels split it into vector lanes, which alone moved outputs by 1e-7 in fastwam_lerobot_interop.py.

Cases: ``default`` (LeRobot's defaults at tiny sizes: schedules, lambdas, 10 Euler steps, seed 42; two
cameras, proprio 3) and ``custom`` (other train and inference shifts and timestep counts, lambdas 0.5 / 2,
freeze_video_expert, mot_checkpoint_mixed_attn, attention in the inputs' dtype, no proprio, one camera,
3 Euler steps with sigma_shift 2.5, seed 7), each also as ``<case>-bf16``: ``torch_dtype=bfloat16``
(parameters, VAE and UMT5 in bf16, as ``--policy.torch_dtype=bfloat16`` trains).

bf16 on the CPU: LeRobot computes its time embedding, time projection and video head under
``torch.amp.autocast("cuda", dtype=torch.float32)``, inert on a CPU (its bf16 model then fails: "mat1 and mat2
must have the same dtype"). Its side therefore runs with CUDA's autocast emulated (_cuda_autocast_on_cpu.py):
``torch.amp.autocast`` in its wan/model.py and wan/video_dit.py is a context that sets torch's CUDA autocast
state and pushes a ``TorchFunctionMode`` casting, as CUDA's autocast does above autograd, the eligible
(floating, non-float64) arguments of exactly the ops on ATen's CUDA autocast lists: lower_precision_fp
(linear, matmul, bmm, einsum, conv, SDPA, ...) to the region's dtype, fp32 / fp32_set_opt_dtype (layer_norm,
pow, sum, softmax, ...) to float32, promote to the widest; every other op keeps ordinary type promotion, and
an op on neither that list nor a checked list of unlisted ones stops the run. LeRobot's
``@torch.amp.autocast("cuda", enabled=False)`` rope functions keep torch's own decorator, which clears that
state, so nothing is cast inside them even within a region (checked by ``self_check`` on its ``rope_params``
before the cases, with the emulation's casts). The report lists every op its regions ran and the casts made
(there: the linears' bf16 weights and biases to float32; the head's layer_norm already gets float32 and the
sinusoid's pow float64, so neither is cast). Ours computes those regions in fp32 explicitly (``Fp32Linear``,
fp32 norm), so bit equality says both compute each op in the same dtype from the same values; it cannot say
CUDA's kernels round as the CPU's do. ``--provoke-bf16-linear`` makes the emulation compute the regions'
linears in bf16 instead, and must FAIL. bf16 training draws: ``torch.randn_like`` in bf16 gives other numbers
in torch 2.11 than in ours (fastwam_flow_lerobot_interop.py), so the bf16 cases replay the reference's draws
in both directions and do not require LeRobot's own draws to be equal (reported as ``own_draws_equal``);
inference noise is drawn in float32 on both sides. Exit status 0: everything passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

import torch
from _interop_common import compare_exact, load_inputs, perturb_constants
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_HELPER = REPO / "packages" / "lerobot-cli" / "tests" / "umt5_tokenizer.py"
BATCH, ACTION_DIM, STATE_DIM, HORIZON, RAW_FRAMES, RATIO = 2, 4, 3, 8, 9, 2
MODEL_FRAMES = (RAW_FRAMES - 1) // RATIO + 1  # 5: one latent transition
IMAGE_SIZE = (32, 64)
MAX_LEN = 128  # the byte-level template is 85 tokens: room for the task
TASKS = ["pick up the red cube", "open the top drawer"]
SEED = 1234  # the tiny VAE and UMT5
CASES = {
    "default": {"cameras": {"observation.images.left": (40, 40), "observation.images.right": (24, 48)}},
    "custom": {
        "cameras": {"observation.images.top": (48, 80)},
        "config": {
            "proprio_dim": None,
            "video_scheduler": {"train_shift": 3.0, "infer_shift": 7.0, "num_train_timesteps": 1000},
            "action_scheduler": {"train_shift": 2.0, "infer_shift": 6.0, "num_train_timesteps": 800},
            "loss": {"lambda_video": 0.5, "lambda_action": 2.0},
            "freeze_video_expert": True,
            "mot_checkpoint_mixed_attn": True,
            "fp32_attention": False,
            "num_inference_steps": 3,
            "sigma_shift": 2.5,
            "inference_seed": 7,
        },
    },
}
# The same two in bfloat16 (parameters, VAE and UMT5 as --policy.torch_dtype=bfloat16 builds them).
CASES |= {f"{name}-bf16": {**spec, "torch_dtype": "bfloat16"} for name, spec in list(CASES.items())}
PARTS = ("loss", "loss_video", "loss_action")


class Draws:
    """Records, or replays (``replay``), the ``torch.randn_like`` / ``torch.rand`` calls of a block (the
    training step's four draws: both are looked up on ``torch`` at call time, on both sides)."""

    def __init__(self, replay: list[torch.Tensor] | None = None) -> None:
        self.replay, self.seen = (None if replay is None else list(replay)), []

    def __enter__(self) -> Self:
        self.saved = torch.randn_like, torch.rand

        def wrap(name, real):
            def draw(*args, **kwargs):
                if self.replay is None:
                    value = real(*args, **kwargs)
                    self.seen.append(value.detach().clone())
                    return value
                value = self.replay.pop(0)
                if name == "randn_like":
                    assert value.shape == args[0].shape and value.dtype == args[0].dtype, name
                self.seen.append(value.clone())
                return value.clone()

            return draw

        torch.randn_like, torch.rand = wrap("randn_like", self.saved[0]), wrap("rand", self.saved[1])
        return self

    def __exit__(self, *exc) -> None:
        torch.randn_like, torch.rand = self.saved


# ---------------------------------------------------------------- shared helpers


def make_batches(case: str, seed: int) -> dict[str, torch.Tensor]:
    """A training batch (``train.*``: every camera at the delta indices, the state too, a padded action
    chunk) and a live batch (``live.*``: one frame per camera, the state), cameras at their own sizes."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, (h, w) in CASES[case]["cameras"].items():
        out[f"train.{key}"] = torch.rand(BATCH, MODEL_FRAMES, 3, h, w, generator=g)
        out[f"live.{key}"] = torch.rand(BATCH, 3, h, w, generator=g)
    if CASES[case].get("config", {}).get("proprio_dim", STATE_DIM) is not None:
        # (without proprio LeRobot's inference refuses a state it would not read; ours ignores it)
        out["train.observation.state"] = torch.randn(BATCH, MODEL_FRAMES, STATE_DIM, generator=g)
        out["live.observation.state"] = torch.randn(BATCH, STATE_DIM, generator=g)
    out["train.action"] = torch.randn(BATCH, HORIZON, ACTION_DIM, generator=g)
    is_pad = torch.zeros(BATCH, HORIZON, dtype=torch.bool)
    is_pad[1, 5:] = True
    out["train.action_is_pad"] = is_pad
    return out


def batch_of(data: dict[str, torch.Tensor], prefix: str) -> dict:
    batch = {k[len(prefix) + 1 :]: v for k, v in data.items() if k.startswith(prefix + ".")}
    return {**batch, "task": list(TASKS)}


def run_policy(policy, data: dict[str, torch.Tensor], seed: int, replay: list | None = None) -> dict:
    """``forward`` + ``backward`` under ``seed`` (its draws recorded, or ``replay``ed), then the chunk."""
    policy.train()
    policy.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with Draws(replay) as draws:
        loss, parts = policy.forward(batch_of(data, "train"))
    loss.backward()
    out = {
        "loss": loss.detach().double(),
        **{k: torch.as_tensor(parts[k], dtype=torch.float64) for k in ("loss_video", "loss_action")},
        **{f"draw.{i}": d for i, d in enumerate(draws.seen)},
        **{f"grad.{n}": p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None},
    }
    policy.zero_grad(set_to_none=True)
    if hasattr(policy, "reset"):
        policy.reset()
    out["chunk"] = policy.predict_action_chunk(batch_of(data, "live"))
    return out


def compare(tag: str, ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> tuple[bool, dict]:
    """Exact equality of every reference tensor; figures: max |Δ| per output, over draws and gradients."""
    groups = {"draw.": "draws", "grad.": "gradients"}
    ok, figures = compare_exact(tag, ref, got, groups, print_mismatches=True)
    figures["grad_tensors"] = sum(1 for k in ref if k.startswith("grad."))
    return ok, figures


def _bf16(case: str) -> bool:
    return CASES[case].get("torch_dtype") == "bfloat16"


def _draws(reference: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The recorded draws of a reference, in order, to replay."""
    return [reference[f"draw.{i}"] for i in range(sum(k.startswith("draw.") for k in reference))]


def save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


# ---------------------------------------------------------------- our side


def _ours_config(case: str):
    from lerobot_cli.features import FeatureType, PolicyFeature
    from lerobot_cli.policies.fastwam.config import FastWAMConfig
    from lerobot_cli.policies.fastwam.dit_configs import tiny_dit_configs

    spec = CASES[case]
    settings = dict(spec.get("config", {}))
    cameras = spec["cameras"]
    width = IMAGE_SIZE[1] // len(cameras)
    inputs = {k: PolicyFeature(FeatureType.VISUAL, (3, IMAGE_SIZE[0], width)) for k in sorted(cameras)}
    proprio = settings.pop("proprio_dim", STATE_DIM)
    if proprio is not None:
        inputs["observation.state"] = PolicyFeature(FeatureType.STATE, (proprio,))
    video, action = tiny_dit_configs(ACTION_DIM)
    return FastWAMConfig(
        action_dim=ACTION_DIM,
        proprio_dim=proprio,
        action_horizon=HORIZON,
        n_action_steps=HORIZON,
        num_video_frames=RAW_FRAMES,
        action_video_freq_ratio=RATIO,
        image_size=IMAGE_SIZE,
        torch_dtype=spec.get("torch_dtype", "float32"),
        tokenizer_max_len=MAX_LEN,
        video_dit_config=video,
        action_dit_config=action,
        input_features=inputs,
        output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))},
        device="cpu",
        **settings,
    )


def _our_frozen(work: Path, config):
    from lerobot_cli.policies.fastwam.frozen import FrozenParts
    from lerobot_cli.policies.fastwam.text import PromptEncoder, load_umt5_encoder, load_umt5_tokenizer
    from lerobot_cli.policies.fastwam.vae import load_wan_vae

    dtype = getattr(torch, config.torch_dtype)
    encoder = load_umt5_encoder(work / "umt5", dtype=dtype)
    prompts = PromptEncoder(load_umt5_tokenizer(work / "tokenizer"), encoder, config.tokenizer_max_len)
    return FrozenParts(load_wan_vae(work / "vae", dtype=dtype), prompts)


def ours_write(work: Path) -> None:
    from lerobot_cli.policies.fastwam.modeling import FastWAMPolicy
    from lerobot_cli.policies.fastwam.text import build_umt5_encoder, tiny_umt5_config
    from lerobot_cli.policies.fastwam.vae import build_wan_vae, tiny_wan_vae_config
    from lerobot_cli.policies.serialization import save_policy_config
    from lerobot_cli.policies.weights import save_state_dict

    spec = importlib.util.spec_from_file_location("umt5_tokenizer", TOKENIZER_HELPER)
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    helper.save_tiny_umt5_tokenizer(work / "tokenizer")
    torch.manual_seed(SEED)
    build_wan_vae(tiny_wan_vae_config()).autoencoder.save_pretrained(str(work / "vae"))
    torch.manual_seed(SEED)
    build_umt5_encoder(tiny_umt5_config(d_model=32)).save_pretrained(str(work / "umt5"))
    for index, case in enumerate(CASES):
        directory = work / case / "ours"
        config = _ours_config(case)
        save_policy_config(config, directory)
        torch.manual_seed(100 + index)
        policy = FastWAMPolicy(config, frozen=_our_frozen(work, config))
        perturb_constants(policy, 200 + index)
        save_state_dict(policy.state_dict(), directory / "model.safetensors")
        save(make_batches(case, 300 + index), work / case / "inputs.safetensors")
        data = load_inputs(work / case / "inputs.safetensors")
        save(run_policy(policy, data, seed=400 + index), directory / "reference.safetensors")


def ours_check(work: Path) -> tuple[bool, dict]:
    from lerobot_cli.policies.fastwam.config import FastWAMConfig
    from lerobot_cli.policies.fastwam.modeling import FastWAMPolicy
    from lerobot_cli.policies.serialization import policy_config_from_dict, policy_config_to_dict
    from lerobot_cli.policies.weights import load_weights

    ok, figures = True, {}
    for index, case in enumerate(CASES):
        directory = work / case / "lerobot"
        written = json.loads((directory / "config.json").read_text())
        config = policy_config_from_dict(written, FastWAMConfig)
        ours_view = policy_config_to_dict(config)
        mismatched = sorted(
            k for k in written if k != "device" and json.loads(json.dumps(ours_view[k])) != written[k]
        )
        if mismatched:
            print(f"[ours] {case}: LeRobot's config.json reads back differently in {mismatched}")
            ok = False
        policy = FastWAMPolicy(config, frozen=_our_frozen(work, config))
        load_weights(policy, directory / "model.safetensors", strict=True)  # LeRobot's save_pretrained file
        data = load_inputs(work / case / "inputs.safetensors")
        reference = load_file(str(directory / "reference.safetensors"))
        replay = _draws(reference) if _bf16(case) else None  # bf16 draws differ between torch versions
        passed, numbers = compare(f"ours {case}", reference, run_policy(policy, data, 500 + index, replay))
        ok &= passed
        figures[case] = numbers
    return ok, figures


# ---------------------------------------------------------------- LeRobot's side


def _lerobot_modeling(work: Path):
    """LeRobot's FastWAM with its three frozen-part loaders reading this check's files (its own loaders
    would fetch the 5 B Wan2.2 repository); everything else is LeRobot's code as installed."""
    from diffusers import AutoencoderKLWan
    from lerobot.policies.fastwam import modeling_fastwam as modeling
    from lerobot.policies.fastwam.wan import WanVideoVAE38
    from lerobot.policies.fastwam.wan.components import WanTextEncoder, WanTokenizer
    from transformers import UMT5EncoderModel

    def vae(*, torch_dtype, device):
        pretrained = AutoencoderKLWan.from_pretrained(str(work / "vae"), torch_dtype=torch_dtype)
        return WanVideoVAE38(dtype=torch_dtype, device=device, pretrained=pretrained)

    def text_encoder(*, model_id, torch_dtype, device, **_):
        pretrained = UMT5EncoderModel.from_pretrained(str(work / "umt5"), dtype=torch_dtype)
        return WanTextEncoder(dtype=torch_dtype, device=device, pretrained=pretrained)

    modeling.load_pretrained_wan_vae = vae
    modeling.load_pretrained_wan_text_encoder = text_encoder
    modeling.build_wan_tokenizer = lambda *, model_id, tokenizer_max_len: WanTokenizer(
        str(work / "tokenizer"), tokenizer_max_len
    )
    return modeling


def lerobot_check(work: Path, provoke: bool = False) -> bool:
    import logging

    import _cuda_autocast_on_cpu as cuda_autocast
    import draccus
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.fastwam.wan import model as wan_model
    from lerobot.policies.fastwam.wan import video_dit as wan_video_dit

    logging.disable(logging.WARNING)
    modeling = _lerobot_modeling(work)
    # Its fp32 regions as CUDA runs them (see the module docstring); the rope functions' own
    # @torch.amp.autocast("cuda", enabled=False) stay torch's, and must still disable casting in a region.
    cuda_autocast.install(wan_model, wan_video_dit)
    cuda_autocast.self_check(lambda: wan_model.rope_params(16, 8))
    cuda_autocast.forget()
    if provoke:
        cuda_autocast.CudaAutocast.override = {"linear": torch.bfloat16}
    ok, report = True, {}
    for index, case in enumerate(CASES):
        ours_dir = work / case / "ours"
        written = json.loads((ours_dir / "config.json").read_text())
        config = PreTrainedConfig.from_pretrained(str(ours_dir))
        parsed = json.loads(json.dumps(draccus.encode(config, PreTrainedConfig)))
        differ = sorted(k for k in written if k not in ("device", "type") and parsed.get(k) != written[k])
        if differ:
            print(f"[lerobot] {case}: LeRobot reads our config.json differently in {differ}")
            ok = False
        policy = modeling.FastWAMPolicy.from_pretrained(str(ours_dir), strict=True)
        data = load_inputs(work / case / "inputs.safetensors")
        reference = load_file(str(ours_dir / "reference.safetensors"))
        own = run_policy(policy, data, seed=400 + index)  # LeRobot's own draws from our seed
        draws_equal, _ = compare(
            f"lerobot {case} draws",
            {k: v for k, v in reference.items() if k.startswith("draw.")},
            {k: v for k, v in own.items() if k.startswith("draw.")},
        )
        replay = _draws(reference)
        passed, figures = compare(f"lerobot {case}", reference, run_policy(policy, data, 400 + index, replay))
        ok &= passed and (draws_equal or _bf16(case))  # bf16 draws: torch 2.11 draws other numbers
        report[case] = figures | {"own_draws_equal": draws_equal}
        torch.manual_seed(600 + index)
        theirs = modeling.FastWAMPolicy(config)
        perturb_constants(theirs, 700 + index)
        out_dir = work / case / "lerobot"
        theirs.save_pretrained(str(out_dir))
        save(run_policy(theirs, data, seed=500 + index), out_dir / "reference.safetensors")
    report["ops in its CUDA autocast regions"] = cuda_autocast.seen()
    (work / "lerobot_report.json").write_text(json.dumps(report))
    return ok


# ---------------------------------------------------------------- driver


def _print_figures(tag: str, figures: dict) -> None:
    for case, numbers in figures.items():
        if case in CASES:
            print(f"{tag} {case}: max |Δ| {numbers}")
        else:
            print(f"{tag} {case}: {numbers}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "mode", nargs="?", default="run", choices=["run", "ours-write", "ours-check", "lerobot-check"]
    )
    parser.add_argument("--work", type=Path, help="work directory (default: a fresh temporary one)")
    parser.add_argument(
        "--lerobot-python",
        default="/tmp/lerobot-venv/bin/python",
        help="interpreter of the environment where LeRobot is installed",
    )
    parser.add_argument(
        "--provoke-bf16-linear",
        action="store_true",
        help="prove the check can fail: LeRobot's fp32 regions compute their linears in bf16 (must FAIL)",
    )
    args = parser.parse_args()
    if args.mode == "ours-write":
        ours_write(args.work)
        return 0
    if args.mode == "lerobot-check":
        return 0 if lerobot_check(args.work, args.provoke_bf16_linear) else 1
    if args.mode == "ours-check":
        ok, figures = ours_check(args.work)
        (args.work / "ours_report.json").write_text(json.dumps(figures))
        return 0 if ok else 1
    start = time.monotonic()
    work = args.work or Path(tempfile.mkdtemp(prefix="fastwam-policy-interop-"))
    work.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())
    ours_write(work)
    theirs_ok = (
        subprocess.run(
            [args.lerobot_python, me, "lerobot-check", "--work", str(work)]
            + ["--provoke-bf16-linear"] * args.provoke_bf16_linear,
            check=False,
        ).returncode
        == 0
    )
    ours_ok = (
        subprocess.run([sys.executable, me, "ours-check", "--work", str(work)], check=False).returncode == 0
    )
    if (work / "lerobot_report.json").is_file():
        _print_figures("LeRobot on our files,", json.loads((work / "lerobot_report.json").read_text()))
    if (work / "ours_report.json").is_file():
        _print_figures("ours on LeRobot's files,", json.loads((work / "ours_report.json").read_text()))
    seconds = time.monotonic() - start
    print(
        f"LeRobot computes ours: {'PASS' if theirs_ok else 'FAIL'}; we compute LeRobot's: "
        f"{'PASS' if ours_ok else 'FAIL'} ({seconds:.0f} s)"
    )
    return 0 if theirs_ok and ours_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
