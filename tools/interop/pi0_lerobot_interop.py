"""Check that our pi0 and LeRobot 0.6.1's compute the same thing, both ways across model.safetensors.

LeRobot needs its own environment (Python 3.12, ``lerobot[pi]==0.6.1``, transformers 5.5), so, like
act_lerobot_interop.py, this script runs in two interpreters and hands files between them:

    uv run python tools/interop/pi0_lerobot_interop.py --lerobot-python /tmp/lerobot-venv/bin/python

Every case of ``CASES`` (what LeRobot users run, not only one ``observation.images.*`` camera in fp32):

    fp32-1cam       one camera observation.images.top, 48x64 (landscape), fp32
    fp32-2cam+empty two other cameras, in this order: observation.wrist_rgb 48x64 (a name without the
                    observation.image prefix: a camera is a VISUAL feature, whatever its name) and
                    observation.images.side 72x40 (portrait), plus --policy.empty_cameras=1, fp32
    bf16-1cam       fp32-1cam with --policy.dtype=bfloat16
    bf16-2cam+empty fp32-2cam+empty with --policy.dtype=bfloat16

Each has a token row with one real token, rows of other lengths padded, state 6, action 6, a 56x56
resolution (both sides resize with padding), chunk 4. Per case:

1. ours-write     (our env)     a seeded tiny policy saved as model.safetensors; the batch, training noise and
                                time, inference noise; our per-element losses, loss, action chunk and the
                                gradient of every parameter as reference.
2. lerobot-check  (LeRobot env) its tiny policy (see ``_patch_lerobot_for_tiny``) of the same config loads our
                                file with ``load_state_dict(strict=True)``; every key's dtype in our file must
                                be the one LeRobot's model holds; it recomputes the reference. Then a seeded
                                LeRobot tiny policy is written with its own ``save_pretrained``, with its
                                outputs (its config.json lists observation.images.empty_camera_0 in
                                input_features).
3. ours-check     (our env)     that directory through our ``--policy.path`` path: ``check_features_fit``
                                against the dataset the case describes (which has no empty camera, as
                                LeRobot's own dataset), then ``load_policy_config`` and ``load_pretrained``;
                                every key of LeRobot's file has our model's dtype; the same comparisons.

Once per run: LeRobot's full-size pi0 with dtype=bfloat16 on the meta device against ours (keys, shapes,
dtypes, value count).

Tolerances (``compare``) and why:

* forward, in fp32 and in bf16: per-element losses, loss and action chunk max |Δ| = 0 (``FORWARD_ATOL``).
  Both sides run the same operations in the same order and dtypes (bf16 towers, fp32 vision tower, norms,
  projections, fp32 loss), so any difference is a bug, not rounding; measured 0 in every case.
* gradients of every parameter: max |Δ| / max |reference| of each parameter ≤ ``GRAD_RTOL[dtype]``; the
  set of parameters that get a gradient must be the same on both sides (the unread lm_heads and the
  language model's last outputs get none on either). Backward is not run in the same order: our joint
  layer and LeRobot's compute the same sums, but autograd accumulates the contributions of a reused
  tensor (the concatenated keys/values, the repeated key/value heads, the prefix shared by every
  suffix token) in another order. In fp32 that moves the last bits (measured ≤ 6e-7 relative:
  ``GRAD_RTOL["float32"]`` = 1e-5); in bf16 the towers' gradients accumulate in bf16 (8 mantissa bits,
  2^-8 = 3.9e-3 relative per rounding) and every gradient upstream of them inherits that, so the same
  reordering moves values by a few bf16 steps (measured ≤ 2e-2 relative): ``GRAD_RTOL["bfloat16"]`` =
  5e-2. A parameter whose gradient is zero in exact arithmetic has only rounding noise on both sides and
  no relative error to speak of: SigLIP's key biases (a key bias adds q·b to all of a query's logits,
  which softmax ignores; measured ~1e-9 against gradients ~1), and the language model's last q_proj
  (its queries feed only the prefix outputs nothing reads; exactly 0 on both sides). Below ``GRAD_NOISE`` ×
  the largest gradient (1e-6: under fp32 rounding of terms that size) a reference gradient counts as such
  noise, and the other side's must be below it too. A dropped camera or a bf16 projection moves the forward
  itself, which the zero forward tolerance catches.

LeRobot only builds gemma_2b / gemma_300m with SigLIP so400m; the tiny sizes come from monkeypatching its
modules in the LeRobot process (never its files): ``modeling_pi0.get_gemma_config`` knows gemma_tiny, the
config's variant fields are set after its validation ran, and the PaliGemma class it builds gets our tiny
SigLIP sizes (LeRobot hard-sets intermediate_size 4304 / projection_dim 2048 on the vision config just
before). Everything runs on the CPU. Exit status 0 means every comparison passed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from _interop_common import perturb_constants  # a fresh model's zero Gemma norms / biases
from safetensors import safe_open
from safetensors.torch import load_file, save_file

FORWARD_ATOL = 0.0  # bit-equal forward, fp32 and bf16 (module doc)
GRAD_RTOL = {"float32": 1e-5, "bfloat16": 5e-2}  # per parameter, max|Δ| / max|reference| (module doc)
GRAD_NOISE = 1e-6  # × the largest gradient: below it a parameter's gradient is rounding noise (module doc)
BATCH, CHUNK, STATE_DIM, ACTION_DIM, TOKENS = 3, 4, 6, 6, 8
TINY = {
    "chunk_size": CHUNK,
    "n_action_steps": CHUNK,
    "image_resolution": (56, 56),
    "max_state_dim": 32,
    "max_action_dim": 32,
}
OURS_TINY = {
    **TINY,
    "paligemma_variant": "gemma_tiny",
    "action_expert_variant": "gemma_tiny",
    "vision_variant": "tiny",
}
PREFIX = "model.paligemma_with_expert."


@dataclass(frozen=True)
class Case:
    """One configuration both sides build and run (the dtype, the cameras and their order, the prompt)."""

    name: str
    dtype: str
    cameras: tuple[tuple[str, tuple[int, int, int]], ...]  # (key, (C, H, W)) in the config's order
    empty_cameras: int
    token_lengths: tuple[int, ...]  # real tokens per row, the rest padding; one row of 1 in each case


ONE_CAMERA = (("observation.images.top", (3, 48, 64)),)
TWO_CAMERAS = (("observation.wrist_rgb", (3, 48, 64)), ("observation.images.side", (3, 72, 40)))
CASES = (
    Case("fp32-1cam", "float32", ONE_CAMERA, 0, (8, 5, 1)),
    Case("fp32-2cam+empty", "float32", TWO_CAMERAS, 1, (1, 8, 3)),
    Case("bf16-1cam", "bfloat16", ONE_CAMERA, 0, (8, 5, 1)),
    Case("bf16-2cam+empty", "bfloat16", TWO_CAMERAS, 1, (1, 8, 3)),
)


@dataclass(frozen=True)
class Flavour:
    """What differs between pi0 and pi05, as names each interpreter imports only on its own side."""

    name: str
    ours_config: str  # "module:Class" in lerobot_cli
    ours_policy: str
    lerobot_modeling: str  # LeRobot's modeling module
    lerobot_policy: str  # its policy class there
    lerobot_config: str  # "module:Class" in lerobot
    model_takes_state: bool  # pi0's model.forward takes the padded state; pi05's reads it from the prompt
    full_keys: int
    full_values: int


PI0 = Flavour(
    "pi0",
    "lerobot_cli.policies.pi0.config:PI0Config",
    "lerobot_cli.policies.pi0.modeling:PI0Policy",
    "lerobot.policies.pi0.modeling_pi0",
    "PI0Policy",
    "lerobot.policies.pi0.configuration_pi0:PI0Config",
    True,
    778,
    4_028_019_472,
)  # LeRobot 0.6.1 pi0 at its default variants (issue 15)


def _import(spec: str):
    module, _, name = spec.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, name) if name else loaded


# ---------------------------------------------------------------- shared (both interpreters)


def make_inputs(case: Case, seed: int) -> dict[str, torch.Tensor]:
    """The case's batch (the empty camera is absent, as in LeRobot's batches), noise and time."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(case.token_lengths)
    cameras = {f"batch.{key}": torch.rand((BATCH, *shape), generator=g) for key, shape in case.cameras}
    return {
        **cameras,
        "batch.observation.state": torch.randn(BATCH, STATE_DIM, generator=g),
        "batch.action": torch.randn(BATCH, CHUNK, ACTION_DIM, generator=g),
        "batch.observation.language.tokens": torch.randint(0, 257_152, (BATCH, TOKENS), generator=g),
        "batch.observation.language.attention_mask": torch.arange(TOKENS)[None] < lengths[:, None],
        "noise": torch.randn(BATCH, CHUNK, 32, generator=g),
        "time": torch.rand(BATCH, generator=g) * 0.999 + 0.001,
        "chunk_noise": torch.randn(BATCH, CHUNK, 32, generator=g),
    }


def batch_of(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k[len("batch.") :]: v.clone() for k, v in inputs.items() if k.startswith("batch.")}


def model_args(batch: dict[str, torch.Tensor], images, img_masks, state, takes_state: bool) -> tuple:
    """The model's forward arguments before noise and time (pi05's model takes no state)."""
    tokens = batch["observation.language.tokens"]
    masks = batch["observation.language.attention_mask"]
    actions = torch.nn.functional.pad(batch["action"], (0, 32 - ACTION_DIM))
    return (images, img_masks, tokens, masks, *([state] if takes_state else []), actions)


def outputs_of(
    losses: torch.Tensor, loss: torch.Tensor, chunk: torch.Tensor, policy
) -> dict[str, torch.Tensor]:
    """Forward outputs, and the gradient of every parameter that got one (none = not in the file)."""
    out = {
        "out.losses": losses.detach().float(),
        "out.loss": loss.detach().float().reshape(1),
        "out.chunk": chunk.detach().float().contiguous(),
    }
    for name, param in policy.named_parameters():
        if param.grad is not None:
            out[f"grad.{name}"] = param.grad.detach().clone().contiguous()
    return out


def compare(
    tag: str, case: Case, ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]
) -> tuple[bool, dict]:
    """Forward max |Δ| (≤ FORWARD_ATOL) and each parameter's gradient max |Δ| / max |ref| (≤ GRAD_RTOL)."""
    figures, ok = {}, True
    for key in ("out.losses", "out.loss", "out.chunk"):
        diff = (ref[key] - got[key]).abs().max().item()
        figures[key[4:]] = diff
        ok &= diff <= FORWARD_ATOL
    names_ref = {k for k in ref if k.startswith("grad.")}
    names_got = {k for k in got if k.startswith("grad.")}
    if names_ref != names_got:
        print(
            f"[{tag}] gradients of different parameters: only in the reference "
            f"{sorted(names_ref - names_got)[:4]}, only here {sorted(names_got - names_ref)[:4]}"
        )
        ok = False
    compared = sorted(names_ref & names_got)
    floor = GRAD_NOISE * max((ref[k].float().abs().max().item() for k in compared), default=0.0)
    worst, worst_abs, worst_name, noise, noise_ok = 0.0, 0.0, "", [], True
    for key in compared:
        r, g = ref[key].float(), got[key].float()
        diff, scale = (r - g).abs().max().item(), r.abs().max().item()
        worst_abs = max(worst_abs, diff)
        if scale < floor:  # zero in exact arithmetic (module doc): both sides must be rounding noise
            noise.append(key[len("grad.") :].removeprefix(PREFIX))
            noise_ok &= g.abs().max().item() < floor
            continue
        if diff / scale > worst:
            worst, worst_name = diff / scale, key[len("grad.") :]
    figures.update(
        grad_rel=worst, grad_abs=worst_abs, grad_worst=worst_name, grads=len(compared), noise=noise
    )
    ok &= worst <= GRAD_RTOL[case.dtype] and noise_ok
    print(
        f"[{tag}] {case.name}: max|Δ| per-element losses {figures['losses']:.2e}, loss "
        f"{figures['loss']:.2e}, action chunk {figures['chunk']:.2e} (tolerance {FORWARD_ATOL}); gradients "
        f"of all {len(compared)} parameters that get one: max rel|Δ| {worst:.2e} (tolerance "
        f"{GRAD_RTOL[case.dtype]:.0e}; {worst_name.removeprefix(PREFIX)}), max|Δ| {worst_abs:.2e}; "
        f"{len(noise)} below the noise floor {floor:.1e} on {'both sides' if noise_ok else 'ONE SIDE ONLY'} "
        f"{noise} -> {'ok' if ok else 'MISMATCH'}"
    )
    return ok, figures


def file_dtypes(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as f:
        return {key: str(f.get_slice(key).get_dtype()) for key in f.keys()}  # noqa: SIM118 - no iterator there


def model_dtypes(model: torch.nn.Module) -> dict[str, str]:
    """The safetensors dtype name each key of ``model`` is saved under."""
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}
    return {k: names.get(v.dtype, str(v.dtype)) for k, v in model.state_dict().items()}


def compare_dtypes(tag: str, saved: dict[str, str], model: dict[str, str]) -> bool:
    differ = sorted(k for k in saved if k in model and saved[k] != model[k])
    counts = {d: sum(1 for v in saved.values() if v == d) for d in sorted(set(saved.values()))}
    print(
        f"[{tag}] dtypes of the file's {len(saved)} keys {counts}; differing from the loading model's: "
        f"{len(differ)} {[f'{k.removeprefix(PREFIX)}: {saved[k]} vs {model[k]}' for k in differ[:4]]} -> "
        f"{'ok' if not differ else 'MISMATCH'}"
    )
    return not differ


def key_shapes(state_dict) -> dict[str, list]:
    return {k: [list(v.shape), str(v.dtype)] for k, v in state_dict.items()}


# ---------------------------------------------------------------- our side (imports lerobot_cli)


def _our_features(case: Case) -> dict:
    from lerobot_cli.features import FeatureType, PolicyFeature

    cameras = {key: PolicyFeature(FeatureType.VISUAL, shape) for key, shape in case.cameras}
    return {
        "input_features": {**cameras, "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,))},
        "output_features": {"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))},
    }


def dataset_features(case: Case) -> dict[str, dict]:
    """meta/info.json's features of the dataset the case trains on (cameras stored H, W, C),
    no empty camera."""
    cameras = {
        key: {"dtype": "video", "shape": [h, w, c], "names": ["height", "width", "channels"]}
        for key, (c, h, w) in case.cameras
    }
    return {
        **cameras,
        "observation.state": {"dtype": "float32", "shape": [STATE_DIM], "names": None},
        "action": {"dtype": "float32", "shape": [ACTION_DIM], "names": None},
    }


def run_ours(policy, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our policy: model-level per-element losses, forward's loss and its gradients, the action chunk."""
    policy.train()
    policy.zero_grad(set_to_none=True)
    batch = batch_of(inputs)
    images, img_masks = policy._images(batch)
    # our pi05 model keeps pi0's forward signature: its state argument is None (the state is in the prompt)
    args = model_args(batch, images, img_masks, policy._state(batch), True)
    with torch.no_grad():
        losses = policy.model(*args, inputs["noise"], inputs["time"])
    loss, _ = policy.forward(batch_of(inputs), noise=inputs["noise"], time=inputs["time"])
    loss.backward()
    chunk = policy.predict_action_chunk(batch_of(inputs), noise=inputs["chunk_noise"])
    return outputs_of(losses, loss, chunk, policy)


def _tiny_sizes() -> dict:
    """The tiny sizes LeRobot is taught (variants.py's gemma_tiny and tiny SigLIP), in transformers' names."""
    import attrs
    from lerobot_cli.policies.common.paligemma.variants import GEMMA_VARIANTS, VISION_VARIANTS

    vision = VISION_VARIANTS["tiny"]
    return {
        "gemma": attrs.asdict(GEMMA_VARIANTS["gemma_tiny"]),
        "vision": {
            "hidden_size": vision.hidden_size,
            "num_hidden_layers": vision.depth,
            "num_attention_heads": vision.num_heads,
            "intermediate_size": vision.intermediate_size,
            "patch_size": vision.patch_size,
        },
    }


def ours_write(work: Path, flavour: Flavour = PI0) -> None:
    config_cls, policy_cls = _import(flavour.ours_config), _import(flavour.ours_policy)
    start = time.perf_counter()
    (work / "tiny_sizes.json").write_text(json.dumps(_tiny_sizes()))
    with torch.device("meta"):
        full = policy_cls(config_cls(**_our_features(CASES[0]), dtype="bfloat16"))
    (work / "ours_full_keys.json").write_text(json.dumps(key_shapes(full.state_dict())))
    del full
    for index, case in enumerate(CASES):
        torch.manual_seed(index)
        policy = policy_cls(
            config_cls(**OURS_TINY, **_our_features(case), dtype=case.dtype, empty_cameras=case.empty_cameras)
        )
        perturb_constants(policy, 1)
        out = work / case.name / "ours"
        out.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.detach().contiguous() for k, v in policy.state_dict().items()},
            str(out / "model.safetensors"),
        )
        inputs = make_inputs(case, 2 + index)
        save_file(inputs, str(work / case.name / "inputs.safetensors"))
        save_file(run_ours(policy, inputs), str(out / "reference.safetensors"))
    print(f"[ours-write] wrote {len(CASES)} cases under {work} ({time.perf_counter() - start:.1f} s)")


def ours_check(work: Path, flavour: Flavour = PI0) -> tuple[bool, dict]:
    """Every case's LeRobot directory through our --policy.path path, then the comparisons."""
    import attrs
    from lerobot_cli.policies.location import resolve_policy_dir
    from lerobot_cli.policies.pretrained import load_pretrained
    from lerobot_cli.policies.serialization import load_policy_config
    from lerobot_cli.workload import check_features_fit

    all_ok, report = True, {}
    for case in CASES:
        tag = f"ours<-lerobot {case.name}"
        src = resolve_policy_dir(str(work / case.name / "lerobot"))
        # What --policy.path=<LeRobot's dir> --policy.vision_variant=tiny does: LeRobot's config.json read by
        # our parser, one flag on top (LeRobot has no such field: its tower is always so400m), the dataset
        # check (LeRobot's input_features name the empty camera, the dataset has none), then our loader.
        config = attrs.evolve(load_policy_config(src), vision_variant="tiny")
        try:
            check_features_fit(config, dataset_features(case), work, f"--policy.path={src}")
            fits = True
        except Exception as exc:  # noqa: BLE001 - the refusal is the finding, reported in one line
            fits = False
            print(f"[{tag}] our dataset check refused LeRobot's checkpoint: {exc}")
        _, policy = load_pretrained(src, config=config)
        file_keys = file_dtypes(src / "model.safetensors")
        keys_ok = set(file_keys) == set(policy.state_dict())
        dtypes_ok = compare_dtypes(tag, file_keys, model_dtypes(policy))
        placeholders = sorted(k for k in config.input_features if "empty_camera" in k)
        print(
            f"[{tag}] LeRobot's save_pretrained: {len(file_keys)} keys, ours {len(policy.state_dict())} "
            f"({'identical' if keys_ok else 'DIFFERENT'}); its input_features' placeholders {placeholders}, "
            f"our dataset check {'accepts' if fits else 'REFUSES'} them"
        )
        inputs = load_file(str(work / case.name / "inputs.safetensors"))
        ok, figures = compare(
            tag, case, load_file(str(src / "reference.safetensors")), run_ours(policy, inputs)
        )
        figures.update(
            keys=len(file_keys), dtypes_ok=dtypes_ok, fits=fits, ok=ok and keys_ok and dtypes_ok and fits
        )
        report[case.name] = figures
        all_ok &= figures["ok"]
    return all_ok, report


# ---------------------------------------------------------------- LeRobot side (imports lerobot)


def _lerobot_config(case: Case, flavour: Flavour, **overrides):
    from lerobot.configs.types import FeatureType, PolicyFeature

    cameras = {key: PolicyFeature(FeatureType.VISUAL, shape) for key, shape in case.cameras}
    return _import(flavour.lerobot_config)(
        device="cpu",
        input_features={**cameras, "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,))},
        output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))},
        **overrides,
    )


def _patch_lerobot_for_tiny(sizes: dict, modeling) -> None:
    """Teach LeRobot's modeling_pi0 (or modeling_pi05, which builds the same way) our gemma_tiny and tiny
    SigLIP (module attributes only)."""
    if getattr(modeling, "_interop_tiny", False):
        return
    known = modeling.get_gemma_config

    def get_gemma_config(variant: str):
        return modeling.GemmaConfig(**sizes["gemma"]) if variant == "gemma_tiny" else known(variant)

    base = modeling.PaliGemmaForConditionalGenerationWithPiGemma

    class TinyVisionPaliGemma(base):
        """LeRobot's PaliGemma class, with the vision config set to our tiny tower when it is built (after
        PaliGemmaWithExpertModel wrote so400m's intermediate_size and projection_dim=2048 into it)."""

        def __init__(self, config):
            for name, value in sizes["vision"].items():
                setattr(config.vision_config, name, value)
            config.vision_config.projection_dim = config.text_config.hidden_size  # the VLM width, as ours
            super().__init__(config)

    modeling.get_gemma_config = get_gemma_config
    modeling.PaliGemmaForConditionalGenerationWithPiGemma = TinyVisionPaliGemma
    modeling._interop_tiny = True


def _lerobot_tiny(work: Path, case: Case, flavour: Flavour, seed: int):
    modeling = _import(flavour.lerobot_modeling)
    _patch_lerobot_for_tiny(json.loads((work / "tiny_sizes.json").read_text()), modeling)
    config = _lerobot_config(case, flavour, **TINY, dtype=case.dtype, empty_cameras=case.empty_cameras)
    # its __post_init__ accepts only gemma_2b / gemma_300m: set the tiny variant after it ran
    config.paligemma_variant = config.action_expert_variant = "gemma_tiny"
    torch.manual_seed(seed)
    return getattr(modeling, flavour.lerobot_policy)(config)


def run_lerobot(policy, inputs: dict[str, torch.Tensor], flavour: Flavour) -> dict[str, torch.Tensor]:
    """LeRobot's policy: ``model.forward``'s per-element losses, ``forward``'s loss and gradients, and
    ``predict_action_chunk``, with its noise/time samplers patched to return the given tensors."""
    model = policy.model
    policy.train()
    policy.zero_grad(set_to_none=True)
    batch = batch_of(inputs)
    images, img_masks = policy._preprocess_images(batch)
    state = policy.prepare_state(batch) if flavour.model_takes_state else None
    with torch.no_grad():
        losses = model.forward(
            *model_args(batch, images, img_masks, state, flavour.model_takes_state),
            inputs["noise"],
            inputs["time"],
        )
    model.sample_noise = lambda shape, device: inputs["noise"].clone()
    model.sample_time = lambda bsize, device: inputs["time"].clone()
    loss, _ = policy.forward(batch_of(inputs))
    loss.backward()
    model.sample_noise = lambda shape, device: inputs["chunk_noise"].clone()
    chunk = policy.predict_action_chunk(batch_of(inputs))
    del model.sample_noise, model.sample_time
    return outputs_of(losses, loss, chunk, policy)


def lerobot_full_keys(work: Path, flavour: Flavour) -> tuple[bool, dict]:
    config = _lerobot_config(CASES[0], flavour, dtype="bfloat16")
    config.device = "meta"
    with torch.device("meta"):
        policy = getattr(_import(flavour.lerobot_modeling), flavour.lerobot_policy)(config)
    return compare_full_keys(
        key_shapes(policy.state_dict()),
        json.loads((work / "ours_full_keys.json").read_text()),
        flavour.full_keys,
        flavour.full_values,
    )


def compare_full_keys(theirs: dict, ours: dict, full_keys: int, full_values: int) -> tuple[bool, dict]:
    """LeRobot's and our full-size key -> (shape, dtype) maps under dtype=bfloat16: same names, shapes and
    dtypes, the expected counts."""
    values = {
        side: sum(int(torch.Size(s).numel()) for s, _ in d.values())
        for side, d in (("lerobot", theirs), ("ours", ours))
    }
    missing, unexpected = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
    shapes = sorted(k for k in set(theirs) & set(ours) if theirs[k][0] != ours[k][0])
    dtypes = sorted(k for k in set(theirs) & set(ours) if theirs[k][1] != ours[k][1])
    ok = (
        not missing
        and not unexpected
        and not shapes
        and not dtypes
        and len(theirs) == full_keys
        and values["lerobot"] == values["ours"] == full_values
    )
    print(
        f"[full size, bf16] keys: LeRobot {len(theirs)}, ours {len(ours)} (expected {full_keys}); values: "
        f"LeRobot {values['lerobot']:,}, ours {values['ours']:,} (expected {full_values:,}); missing in ours "
        f"{missing[:4]}, extra in ours {unexpected[:4]}, shape differences {shapes[:4]}, dtype differences "
        f"{dtypes[:4]} -> {'ok' if ok else 'MISMATCH'}"
    )
    return ok, {
        "keys_lerobot": len(theirs),
        "keys_ours": len(ours),
        "values_lerobot": values["lerobot"],
        "values_ours": values["ours"],
        "missing": len(missing),
        "unexpected": len(unexpected),
        "shape_diffs": len(shapes),
        "dtype_diffs": len(dtypes),
    }


def lerobot_cases(work: Path, flavour: Flavour) -> tuple[bool, dict]:
    """Every case, LeRobot's side: our file loaded and recomputed, then LeRobot's own directory written."""
    all_ok, report = True, {}
    for index, case in enumerate(CASES):
        tag = f"lerobot<-ours {case.name}"
        policy = _lerobot_tiny(
            work, case, flavour, 100 + index
        )  # its own seeded weights, all replaced by ours
        ours = work / case.name / "ours" / "model.safetensors"
        state = load_file(str(ours))
        try:
            policy.load_state_dict(state, strict=True)
            load_ok = True
        except RuntimeError as exc:
            load_ok = False
            print(f"[{tag}] load_state_dict(strict=True) FAILED: {str(exc)[:2000]}")
        dtypes_ok = compare_dtypes(tag, file_dtypes(ours), model_dtypes(policy))
        inputs = load_file(str(work / case.name / "inputs.safetensors"))
        ok = False
        if load_ok:
            ok, report[case.name] = compare(
                tag,
                case,
                load_file(str(ours.with_name("reference.safetensors"))),
                run_lerobot(policy, inputs, flavour),
            )
            report[case.name].update(keys=len(state), dtypes_ok=dtypes_ok, ok=ok and dtypes_ok)
        all_ok &= load_ok and ok and dtypes_ok

        policy = _lerobot_tiny(work, case, flavour, 10 + index)
        perturb_constants(policy, 11)
        out = work / case.name / "lerobot"
        policy.save_pretrained(str(out))
        save_file(run_lerobot(policy, inputs, flavour), str(out / "reference.safetensors"))
    return all_ok, report


def lerobot_check(
    work: Path, flavour: Flavour = PI0, extra: Callable[[Path], tuple[bool, dict]] | None = None
) -> bool:
    """LeRobot's side: the full-size keys, ``extra`` checks (pi05's config and statistics), every case."""
    start = time.perf_counter()
    report: dict = {}
    full_ok, report["full"] = lerobot_full_keys(work, flavour)
    extra_ok, report["extra"] = extra(work) if extra else (True, {})
    cases_ok, report["cases"] = lerobot_cases(work, flavour)
    print(f"[lerobot-check] wrote LeRobot's directories ({time.perf_counter() - start:.1f} s)")
    report["ok"] = {"full": full_ok, "extra": extra_ok, "cases": cases_ok}
    (work / "lerobot_report.json").write_text(json.dumps(report))
    return full_ok and extra_ok and cases_ok


# ---------------------------------------------------------------- driver


def print_report(lerobot: dict, ours: dict | None, ours_ok: bool, policy: str = "pi0") -> None:
    full = lerobot.get("full", {})
    print(f"{policy} interop with LeRobot 0.6.1 (CPU)")
    if full:
        print(
            f"  full size (meta, bf16): keys {full['keys_ours']} ours / {full['keys_lerobot']} LeRobot, "
            f"values {full['values_ours']:,} / {full['values_lerobot']:,}, missing {full['missing']}, extra "
            f"{full['unexpected']}, shape diffs {full['shape_diffs']}, dtype diffs {full['dtype_diffs']}: "
            f"{'PASS' if lerobot['ok']['full'] else 'FAIL'}"
        )
    for case in CASES:
        for label, fig in (
            ("ours -> LeRobot", lerobot.get("cases", {}).get(case.name)),
            ("LeRobot -> ours", (ours or {}).get(case.name)),
        ):
            if not fig:
                print(f"  {case.name:16s} {label}: FAIL (no figures)")
                continue
            print(
                f"  {case.name:16s} {label}: {fig['keys']} keys, "
                f"dtypes {'equal' if fig['dtypes_ok'] else 'DIFFER'}; "
                f"max|Δ| losses {fig['losses']:.1e}, loss {fig['loss']:.1e}, chunk {fig['chunk']:.1e} (tol "
                f"{FORWARD_ATOL}); {fig['grads']} grads max rel|Δ| {fig['grad_rel']:.1e} (tol "
                f"{GRAD_RTOL[case.dtype]:.0e}; {len(fig['noise'])} zero in exact arithmetic), max|Δ| "
                f"{fig['grad_abs']:.1e}{'' if fig.get('fits', True) else '; REFUSED by our dataset check'}: "
                f"{'PASS' if fig['ok'] else 'FAIL'}"
            )


def main(policy: str = "pi0", script: str = __file__, steps: tuple | None = None) -> int:
    """The driver (argument parsing, both interpreters, the report). Another policy's script passes its
    name, its own file (the LeRobot interpreter runs it) and ``steps``: its (ours_write, ours_check,
    lerobot_check, report) functions, with the signatures of this module's."""
    write, check, lerobot_side, report = steps or (ours_write, ours_check, lerobot_check, print_report)
    parser = argparse.ArgumentParser(
        description=sys.modules["__main__"].__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "mode", nargs="?", default="run", choices=["run", "ours-write", "ours-check", "lerobot-check"]
    )
    parser.add_argument("dir", nargs="?", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument(
        "--lerobot-python",
        default="/tmp/lerobot-venv/bin/python",
        help="interpreter of the environment where LeRobot (with its [pi] extra) is installed",
    )
    args = parser.parse_args()
    torch.set_num_threads(min(4, torch.get_num_threads()))
    if args.mode == "ours-write":
        write(args.dir)
        return 0
    if args.mode == "ours-check":
        return 0 if check(args.dir)[0] else 1
    if args.mode == "lerobot-check":
        return 0 if lerobot_side(args.dir) else 1
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"{policy}-interop-") as tmp:
        work = args.dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        write(work)
        lerobot = subprocess.run(
            [args.lerobot_python, str(Path(script).resolve()), "lerobot-check", str(work)], check=False
        )
        report_file = work / "lerobot_report.json"
        lerobot_report = json.loads(report_file.read_text()) if report_file.is_file() else {}
        ours_ok, ours_figures = False, None
        if all((work / case.name / "lerobot" / "reference.safetensors").is_file() for case in CASES):
            ours_ok, ours_figures = check(work)
        report(lerobot_report, ours_figures, ours_ok)
    passed = lerobot.returncode == 0 and ours_ok
    print(
        f"LeRobot computes ours: {'PASS' if lerobot.returncode == 0 else 'FAIL'}; we compute LeRobot's: "
        f"{'PASS' if ours_ok else 'FAIL'} ({time.perf_counter() - start:.0f} s)"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
