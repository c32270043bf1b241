r"""Check that Diffusion Policy ``pretrained_model/`` directories cross between this trainer and LeRobot.

Same two-interpreter scheme as ``act_lerobot_interop.py`` (LeRobot 0.6.1 with its ``diffusion`` extra,
i.e. diffusers, in its own Python 3.12 environment; ``tools/interop/ci.sh`` builds it):

    uv run python tools/interop/diffusion_lerobot_interop.py \
        --lerobot-python ~/.cache/lerobot-interop/lerobot-0.6.1-py312/bin/python

1. ours-write     (our env)     build small diffusion policies (one per variant), processors with random
                                stats; save them; record inputs and our outputs in reference.safetensors.
2. lerobot-check  (LeRobot env) load that directory with LeRobot's ``DiffusionPolicy.from_pretrained`` and
                                ``make_pre_post_processors``; compare key sets and shapes, the action chunk
                                and the training loss; then write a LeRobot-made directory with its reference.
3. ours-check     (our env)     load LeRobot's directory with ``load_pretrained`` / ``load_processors`` and
                                compare the same way.

"Same noise and timesteps": both sides draw them from torch's global generator in the same order (the
loss: random crops, one ``randn`` of the trajectory's shape, one ``randint`` of timesteps; the chunk: the
prior, then one ``randn`` per DDPM step), so each comparison seeds it before the call. The loss runs in
train mode (batch norms use batch statistics and update their running ones); the chunk, before it, in eval.

EMA (``--ema.enable=true``): our ``lerobot-train`` writes ``pretrained_model_ema/`` for a short run on the
demo dataset; LeRobot's ``from_pretrained`` loads it (keys, shapes, chunk and loss compared as above), and
our EMA update over a sequence of weight snapshots is compared with diffusers' ``EMAModel`` built as
LeRobot's trainer builds it (warmup schedule, ``update_after_step``).

``lerobot-sizes`` (LeRobot env) prints the key and parameter counts of the full default-size policy that
``packages/lerobot-cli/tests/test_policy_diffusion.py`` checks ours against.
Exit status 0 means every comparison passed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ATOL = 1e-5
# name -> (features {key: (type, shape)}, config overrides)
VARIANTS = {
    # (camera sizes give feature maps of 2x2 or more: on a 1x1 map spatial softmax is constant and the
    # camera would not matter)
    # DDPM, epsilon, two cameras with random crops, each through its own encoder, state + env state, FiLM
    # scale, padding-masked loss. The cameras have no observation.images prefix and are not in alphabetical
    # order: LeRobot takes every VISUAL feature in the config's order (camera i -> encoder i), never a key
    # prefix, and so must we.
    "ddpm": (
        {
            "observation.state": ("STATE", (4,)),
            "observation.environment_state": ("ENV", (3,)),
            "observation.wrist_rgb": ("VISUAL", (3, 72, 80)),
            "observation.top": ("VISUAL", (3, 72, 80)),
            "action": ("ACTION", (2,)),
        },
        {
            "n_obs_steps": 2,
            "horizon": 8,
            "n_action_steps": 4,
            "down_dims": [16, 32],
            "kernel_size": 5,
            "n_groups": 8,
            "diffusion_step_embed_dim": 16,
            "spatial_softmax_num_keypoints": 8,
            "crop_shape": [64, 70],
            "crop_is_random": True,
            "num_train_timesteps": 20,
            "do_mask_loss_for_padding": True,
        },
    ),
    # DDIM, sample prediction, two cameras through one shared group-norm encoder, resize + crop ratio,
    # three observation steps, bias-only FiLM, clip range 1.5, 5 inference steps
    "ddim": (
        {
            "observation.state": ("STATE", (3,)),
            "observation.images.left": ("VISUAL", (3, 50, 60)),
            "observation.images.right": ("VISUAL", (3, 50, 60)),
            "action": ("ACTION", (3,)),
        },
        {
            "n_obs_steps": 3,
            "horizon": 16,
            "n_action_steps": 6,
            "down_dims": [8, 16, 32],
            "kernel_size": 3,
            "n_groups": 4,
            "diffusion_step_embed_dim": 8,
            "spatial_softmax_num_keypoints": 4,
            "use_separate_rgb_encoder_per_camera": False,
            "use_group_norm": True,
            "resize_shape": [80, 72],
            "crop_ratio": 0.8,
            "noise_scheduler_type": "DDIM",
            "prediction_type": "sample",
            "num_train_timesteps": 50,
            "num_inference_steps": 5,
            "use_film_scale_modulation": False,
            "clip_sample_range": 1.5,
        },
    ),
    # no camera (environment state only), linear betas, DDPM without clipping
    "nocam": (
        {
            "observation.state": ("STATE", (5,)),
            "observation.environment_state": ("ENV", (6,)),
            "action": ("ACTION", (4,)),
        },
        {
            "n_obs_steps": 2,
            "horizon": 8,
            "n_action_steps": 7,
            "down_dims": [16, 32],
            "diffusion_step_embed_dim": 8,
            "beta_schedule": "linear",
            "clip_sample": False,
            "num_train_timesteps": 12,
        },
    ),
}
LOSS_SEED, CHUNK_SEED = 1234, 99
REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
# the tiny diffusion run of tests/test_diffusion_layouts.py, with EMA (update_after_step 1: a copy first)
EMA_RUN = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=0",
    "--policy.type=diffusion",
    "--policy.pretrained_backbone_weights=null",
    "--policy.use_group_norm=true",
    "--policy.down_dims=[16,32]",
    "--policy.horizon=8",
    "--policy.n_action_steps=4",
    "--policy.spatial_softmax_num_keypoints=8",
    "--policy.diffusion_step_embed_dim=16",
    "--policy.num_train_timesteps=20",
    "--policy.scheduler_warmup_steps=0",
    "--policy.optimizer_lr=1e-3",
    "--steps=4",
    "--save_freq=4",
    "--log_freq=0",
    "--batch_size=4",
    "--ema.enable=true",
    "--ema.update_after_step=1",
    "--ema.power=0.5",
]
EMA_SEQUENCE = {"update_after_step": 1, "inv_gamma": 1.0, "power": 0.5, "min_decay": 0.0, "max_decay": 0.9999}
SCHEDULER_ATOL = 1e-6
# LR schedules of the diffusion preset: (diffusers scheduler name, warm-up steps, run steps)
LR_CASES = [("cosine", 5, 20), ("cosine", 500, 3000), ("constant_with_warmup", 7, 30)]
# scheduler cases: (type, beta_schedule, prediction_type, clip_sample,
# num_train_timesteps, num_inference_steps)
SCHEDULER_CASES = [
    (kind, schedule, pred, clip, 100, steps)
    for kind in ("DDPM", "DDIM")
    for schedule in ("squaredcos_cap_v2", "linear", "scaled_linear")
    for pred in ("epsilon", "sample")
    for clip in (True, False)
    for steps in (100, 7)
]


def _tuples(overrides: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}


def make_stats(features: dict, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    stats = {}
    for key, (kind, shape) in features.items():
        dim = shape[0]
        shp = (dim, 1, 1) if kind == "VISUAL" else (dim,)
        stats[key] = {
            "mean": torch.rand(shp, generator=g),
            "std": 0.5 + torch.rand(shp, generator=g),
            "min": -1 - torch.rand(shp, generator=g),
            "max": 1 + torch.rand(shp, generator=g),
        }
    return stats


def make_inputs(features: dict, overrides: dict, seed: int, batch: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n_obs, horizon = overrides["n_obs_steps"], overrides["horizon"]
    out = {}
    for key, (kind, shape) in features.items():
        if kind == "VISUAL":
            out[key] = torch.rand((batch, n_obs, *shape), generator=g)
        elif kind == "ACTION":
            out[key] = torch.randn((batch, horizon, *shape), generator=g)
        else:
            out[key] = torch.randn((batch, n_obs, *shape), generator=g)
    pad = torch.zeros(batch, horizon, dtype=torch.bool)
    pad[0, -3:] = True  # the first sample's episode ends inside its horizon
    out["action_is_pad"] = pad
    return out


def perturb_batch_norm(module: torch.nn.Module, seed: int) -> None:
    """Random BN statistics and affine terms: fresh ones (identity) would hide BN bugs in eval mode."""
    g = torch.Generator().manual_seed(seed)
    for name, buf in module.named_buffers():
        if name.endswith("running_var"):
            buf.copy_(0.5 + torch.rand(buf.shape, generator=g))
        elif name.endswith("running_mean"):
            buf.copy_(0.1 * torch.randn(buf.shape, generator=g))
    for name, p in module.named_parameters():
        if ".backbone." in name and p.dim() == 1:
            p.add_(0.1 * torch.randn(p.shape, generator=g))


def run_policy(policy, pre, post, inputs: dict) -> dict[str, torch.Tensor]:
    """The eval action chunk through the processors, then the training loss, each at a fixed seed."""
    obs = {k: v for k, v in inputs.items() if k.startswith("observation.")}
    policy.eval()
    policy.reset()
    torch.manual_seed(CHUNK_SEED)
    chunk = post(policy.predict_action_chunk(pre(obs)))
    policy.train()
    torch.manual_seed(LOSS_SEED)
    loss, _ = policy.forward(pre(dict(inputs)))
    policy.eval()
    return {"out.chunk": chunk.detach().float().contiguous(), "out.loss": loss.detach().reshape(1)}


def compare(tag: str, ref: dict, got: dict) -> bool:
    ok = True
    for key in ("out.chunk", "out.loss"):
        diff = (ref[key] - got[key]).abs().max().item()
        good = diff <= ATOL * max(1.0, ref[key].abs().max().item())
        ok &= good
        print(
            f"[{tag}] {key:10s} max|Δ| = {diff:.2e} (value scale {ref[key].abs().max().item():.3g}) "
            f"{'ok' if good else 'MISMATCH'}"
        )
    return ok


def check_keys(tag: str, policy, weights_file: Path) -> bool:
    file = load_file(str(weights_file))
    model = policy.state_dict()
    missing, unexpected = sorted(set(model) - set(file)), sorted(set(file) - set(model))
    shapes = [k for k in set(model) & set(file) if tuple(model[k].shape) != tuple(file[k].shape)]
    print(
        f"[{tag}] state-dict keys: {len(model)} in model, {len(file)} in file, missing {missing[:5]}, "
        f"unexpected {unexpected[:5]}, shape mismatches {shapes[:5]}"
    )
    return not missing and not unexpected and not shapes


def save_reference(path: Path, inputs: dict, outputs: dict) -> None:
    save_file({**{f"in.{k}": v.contiguous() for k, v in inputs.items()}, **outputs}, str(path))


def load_reference(path: Path) -> tuple[dict, dict]:
    data = load_file(str(path))
    inputs = {k[3:]: v for k, v in data.items() if k.startswith("in.")}
    return inputs, {k: v for k, v in data.items() if k.startswith("out.")}


def run_scheduler(make, case: tuple) -> dict[str, torch.Tensor]:
    """betas, add_noise at every 9th timestep, and a whole reverse chain (fixed model outputs, seeded
    DDPM noise) of one scheduler built by ``make(name, **kwargs)``."""
    kind, schedule, pred, clip, train_steps, steps = case
    sched = make(
        kind,
        num_train_timesteps=train_steps,
        beta_start=1e-4,
        beta_end=0.02,
        beta_schedule=schedule,
        clip_sample=clip,
        clip_sample_range=1.0,
        prediction_type=pred,
    )
    g = torch.Generator().manual_seed(5)
    x0, eps = torch.randn(4, 8, 3, generator=g), torch.randn(4, 8, 3, generator=g)
    ts = torch.arange(0, train_steps, 9)[:4]
    noisy = sched.add_noise(x0, eps, ts)
    sched.set_timesteps(steps)
    sample = torch.randn(4, 8, 3, generator=g)
    outputs = torch.randn(len(sched.timesteps), 4, 8, 3, generator=g)
    torch.manual_seed(7)
    for i, t in enumerate(sched.timesteps):
        result = sched.step(outputs[i], t, sample)
        sample = getattr(result, "prev_sample", result)
    return {
        "alphas_cumprod": sched.alphas_cumprod.clone(),
        "noisy": noisy,
        "final": sample,
        "timesteps": torch.as_tensor(sched.timesteps).clone(),
    }


def case_name(case: tuple) -> str:
    return "-".join(str(part) for part in case)


# ---------------------------------------------------------------- our side (imports lerobot_cli)


def ours_write(work: Path, variant: str) -> None:
    from lerobot_cli.features import PolicyFeature
    from lerobot_cli.policies.diffusion.config import DiffusionConfig
    from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy
    from lerobot_cli.policies.pretrained import save_pretrained
    from lerobot_cli.processors import make_pre_post_processors, save_processors

    features, overrides = VARIANTS[variant]
    feats = {k: PolicyFeature(type=t, shape=s) for k, (t, s) in features.items()}
    cfg = DiffusionConfig(
        input_features={k: f for k, f in feats.items() if k != "action"},
        output_features={"action": feats["action"]},
        device="cpu",
        pretrained_backbone_weights=None,
        **_tuples(overrides),
    )
    torch.manual_seed(0)
    policy = DiffusionPolicy(cfg)
    with torch.no_grad():
        perturb_batch_norm(policy, 1)
    pre, post = make_pre_post_processors(cfg, make_stats(features, 2))
    out = work / f"ours_{variant}"
    save_pretrained(policy, cfg, out)
    save_processors(pre, post, out)
    inputs = make_inputs(features, overrides, 3)
    outputs = run_policy(policy, pre, post, inputs)
    save_reference(out / "reference.safetensors", inputs, outputs)
    cameras = [k for k, (kind, _) in features.items() if kind == "VISUAL"]
    if cameras:  # the comparison must exercise the camera path: other images, another loss
        blank = {**inputs, **{k: torch.zeros_like(inputs[k]) for k in cameras}}
        if torch.equal(run_policy(policy, pre, post, blank)["out.loss"], outputs["out.loss"]):
            raise SystemExit(f"[ours-write] {variant}: the loss does not depend on the cameras")
    print(f"[ours-write] wrote {out}")


def ours_check(work: Path, variant: str) -> bool:
    from lerobot_cli.policies.pretrained import load_pretrained
    from lerobot_cli.processors import load_processors

    src = work / f"lerobot_{variant}"
    cfg, policy = load_pretrained(src)
    pre, post = load_processors(src)
    inputs, ref = load_reference(src / "reference.safetensors")
    tag = f"ours<-lerobot {variant}"
    ok = check_keys(tag, policy, src / "model.safetensors")
    ok = config_matches(tag, src, cfg) and ok
    return compare(tag, ref, run_policy(policy, pre, post, inputs)) and ok


def config_matches(tag: str, src: Path, cfg) -> bool:
    """Every field of LeRobot's config.json reads back with the same value in ours."""
    from lerobot_cli.policies.serialization import policy_config_to_dict

    theirs = json.loads((src / "config.json").read_text())
    ours = json.loads(json.dumps(policy_config_to_dict(cfg)))
    differ = {k: (theirs[k], ours.get(k, "<absent>")) for k in theirs if ours.get(k, "<absent>") != theirs[k]}
    print(f"[{tag}] config.json: {len(theirs)} LeRobot keys, differing after our load: {differ or 'none'}")
    return not differ


def ours_write_ema(work: Path) -> None:
    """A 4-step EMA run's ``pretrained_model_ema/`` with our reference outputs,
    and our EMA over 8 snapshots."""
    from lerobot_cli.policies.pretrained import load_pretrained
    from lerobot_cli.processors import load_processors
    from lerobot_trainloop import EmaConfig, ModelEma

    out = work / "ours_ema_run"
    subprocess.run(
        [str(Path(sys.executable).parent / "lerobot-train"), *EMA_RUN, f"--output_dir={out}"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    step = out / "checkpoints" / "last"
    src = step / "pretrained_model_ema"
    cfg, policy = load_pretrained(src)
    live = load_file(str(step / "pretrained_model" / "model.safetensors"))
    ema = load_file(str(src / "model.safetensors"))
    moved = max((ema[k] - live[k]).abs().max().item() for k in ema if k in live)
    if moved == 0:
        raise SystemExit("[ours-write ema] pretrained_model_ema/ holds the live weights")
    pre, post = load_processors(src)
    features = {
        k: (f.type.value, tuple(f.shape)) for k, f in {**cfg.input_features, **cfg.output_features}.items()
    }
    inputs = make_inputs(features, {"n_obs_steps": cfg.n_obs_steps, "horizon": cfg.horizon}, 21)
    save_reference(src / "reference.safetensors", inputs, run_policy(policy, pre, post, inputs))

    g = torch.Generator().manual_seed(8)
    shapes = {"w": (5, 3), "b": (5,)}
    module = torch.nn.Module()
    for name, shape in shapes.items():
        module.register_parameter(name, torch.nn.Parameter(torch.randn(shape, generator=g)))
    tensors = {f"start.{n}": p.detach().clone() for n, p in module.named_parameters()}
    tracker = ModelEma(module, EmaConfig(enable=True, **EMA_SEQUENCE))
    for i in range(8):
        with torch.no_grad():
            for name, p in module.named_parameters():
                p.copy_(torch.randn(p.shape, generator=g))
                tensors[f"live{i}.{name}"] = p.detach().clone()
        tracker.update()
        for name, value in tracker.state().items():
            tensors[f"ema{i}.{name}"] = value.clone()
    save_file(tensors, str(work / "ema_sequence.safetensors"))
    print(f"[ours-write] wrote {src} (EMA vs live weights: max|Δ| {moved:.2e}) and 8 EMA updates")


# ---------------------------------------------------------------- LeRobot side (imports lerobot)


def _lerobot_config(features: dict, overrides: dict):
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

    feats = {k: PolicyFeature(type=FeatureType[t], shape=s) for k, (t, s) in features.items()}
    return DiffusionConfig(
        input_features={k: f for k, f in feats.items() if k != "action"},
        output_features={"action": feats["action"]},
        pretrained_backbone_weights=None,
        device="cpu",
        **_tuples(overrides),
    )


def _lerobot_make(features: dict, overrides: dict, seed: int):
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    from lerobot.policies.factory import make_pre_post_processors

    cfg = _lerobot_config(features, overrides)
    torch.manual_seed(seed)
    policy = DiffusionPolicy(cfg)
    with torch.no_grad():
        perturb_batch_norm(policy, seed + 1)
    pre, post = make_pre_post_processors(cfg, dataset_stats=make_stats(features, seed + 2))
    return policy.eval(), pre, post


def lerobot_check(work: Path, variant: str) -> bool:
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    from lerobot.policies.factory import make_pre_post_processors

    src = work / f"ours_{variant}"
    policy = DiffusionPolicy.from_pretrained(str(src))
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(src))
    inputs, ref = load_reference(src / "reference.safetensors")
    tag = f"lerobot<-ours {variant}"
    ok = check_keys(tag, policy, src / "model.safetensors")
    ok = compare(tag, ref, run_policy(policy, pre, post, inputs)) and ok

    features, overrides = VARIANTS[variant]
    policy, pre, post = _lerobot_make(features, overrides, 10)
    out = work / f"lerobot_{variant}"
    policy.save_pretrained(str(out))
    pre.save_pretrained(str(out))
    post.save_pretrained(str(out))
    inputs = make_inputs(features, overrides, 13)
    save_reference(out / "reference.safetensors", inputs, run_policy(policy, pre, post, inputs))
    print(f"[lerobot-check] wrote {out}")
    return ok


def lerobot_check_ema(work: Path) -> bool:
    """LeRobot loads our ``pretrained_model_ema/``; diffusers' EMAModel (LeRobot's trainer's EMA)
    equals ours."""
    from diffusers.training_utils import EMAModel
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    from lerobot.policies.factory import make_pre_post_processors

    src = work / "ours_ema_run" / "checkpoints" / "last" / "pretrained_model_ema"
    policy = DiffusionPolicy.from_pretrained(str(src))
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(src))
    inputs, ref = load_reference(src / "reference.safetensors")
    tag = "lerobot<-ours ema"
    ok = check_keys(tag, policy, src / "model.safetensors")
    ok = compare(tag, ref, run_policy(policy, pre, post, inputs)) and ok

    seq = load_file(str(work / "ema_sequence.safetensors"))
    names = sorted({k.split(".", 1)[1] for k in seq if k.startswith("start.")})
    params = [torch.nn.Parameter(seq[f"start.{n}"].clone()) for n in names]
    cfg = EMA_SEQUENCE  # as LeRobot's lerobot_train builds it: decay=max_decay, warmup on
    ema = EMAModel(
        params,
        decay=cfg["max_decay"],
        min_decay=cfg["min_decay"],
        update_after_step=cfg["update_after_step"],
        use_ema_warmup=True,
        inv_gamma=cfg["inv_gamma"],
        power=cfg["power"],
    )
    worst = 0.0
    for i in range(8):
        with torch.no_grad():
            for n, p in zip(names, params, strict=True):
                p.copy_(seq[f"live{i}.{n}"])
        ema.step(params)
        for n, s in zip(names, ema.shadow_params, strict=True):
            worst = max(worst, (s - seq[f"ema{i}.{n}"]).abs().max().item())
    print(f"[{tag}] 8 EMA updates vs diffusers' EMAModel (LeRobot's): max|Δ| = {worst:.2e}")
    return ok and worst == 0.0


def lerobot_schedulers(out: Path) -> None:
    """diffusers' results for every scheduler case (what LeRobot's DiffusionModel builds)."""
    from diffusers.optimization import get_scheduler
    from lerobot.policies.diffusion.modeling_diffusion import _make_noise_scheduler

    tensors = {
        f"{case_name(c)}.{k}": v.contiguous()
        for c in SCHEDULER_CASES
        for k, v in run_scheduler(_make_noise_scheduler, c).items()
    }
    for name, warmup, steps in LR_CASES:  # how LeRobot's DiffuserSchedulerConfig.build makes the LR schedule
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)
        sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=steps)
        tensors[f"lr.{name}.{warmup}.{steps}"] = torch.tensor(
            _lr_curve(opt, sched, steps), dtype=torch.float64
        )
    save_file(tensors, str(out))
    print(f"[lerobot-schedulers] wrote {len(SCHEDULER_CASES)} cases to {out}")


def _lr_curve(opt, sched, steps: int) -> list[float]:
    out = []
    for _ in range(steps + 1):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def ours_schedulers(ref_file: Path) -> bool:
    from lerobot_cli.optim.factory import build_scheduler
    from lerobot_cli.policies.diffusion.config import DiffusionConfig
    from lerobot_cli.policies.diffusion.schedulers import make_noise_scheduler

    ref = load_file(str(ref_file))
    worst, bad = 0.0, []
    for case in SCHEDULER_CASES:
        for key, value in run_scheduler(make_noise_scheduler, case).items():
            expected = ref[f"{case_name(case)}.{key}"]
            diff = (
                (value.double() - expected.double()).abs().max().item()
                if value.shape == expected.shape
                else 1e9
            )
            worst = max(worst, diff)
            if diff > SCHEDULER_ATOL:
                bad.append(f"{case_name(case)}.{key}: {diff:.2e}")
    print(
        f"[ours vs diffusers] {len(SCHEDULER_CASES)} scheduler cases (DDPM/DDIM x 3 beta schedules x "
        f"epsilon/sample x clip on/off x 100/7 steps): max|Δ| = {worst:.2e} {'ok' if not bad else bad[:5]}"
    )
    lr_worst = 0.0
    for name, warmup, steps in LR_CASES:  # the preset's LR schedule, through our optimizer factory
        preset = DiffusionConfig(
            scheduler_name=name, scheduler_warmup_steps=warmup, optimizer_lr=1e-4
        ).scheduler_preset()
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)
        ours = torch.tensor(_lr_curve(opt, build_scheduler(preset, opt, steps), steps), dtype=torch.float64)
        lr_worst = max(lr_worst, (ours - ref[f"lr.{name}.{warmup}.{steps}"]).abs().max().item())
    print(
        "[ours vs diffusers] LR schedules of the preset "
        f"({', '.join(f'{n} W={w} T={t}' for n, w, t in LR_CASES)}): max|Δ| = {lr_worst:.2e} (lr 1e-4)"
    )
    return not bad and lr_worst <= 1e-12


def lerobot_sizes() -> None:
    """Full default DiffusionConfig (ResNet18, down_dims 512/1024/2048) with one 3x96x96 camera, state 2,
    action 2 (PushT's features): key count, parameter count, buffer elements."""
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

    features = {
        "observation.state": ("STATE", (2,)),
        "observation.images.top": ("VISUAL", (3, 96, 96)),
        "action": ("ACTION", (2,)),
    }
    policy = DiffusionPolicy(_lerobot_config(features, {}))
    sd = policy.state_dict()
    print(
        json.dumps(
            {
                "keys": len(sd),
                "parameters": sum(p.numel() for p in policy.parameters()),
                "state_elements": sum(v.numel() for v in sd.values()),
            }
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "mode",
        nargs="?",
        default="run",
        choices=[
            "run",
            "ours-write",
            "ours-check",
            "lerobot-check",
            "lerobot-sizes",
            "lerobot-schedulers",
            "lerobot-check-ema",
        ],
    )
    parser.add_argument("dir", nargs="?", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument(
        "--variant",
        choices=sorted(VARIANTS),
        action="append",
        help="config variant(s) to check (default: all)",
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
        results = [ours_check(args.dir, v) for v in variants]
        return 0 if all(results) else 1
    if args.mode == "lerobot-check":
        results = [lerobot_check(args.dir, v) for v in variants]
        return 0 if all(results) else 1
    if args.mode == "lerobot-sizes":
        lerobot_sizes()
        return 0
    if args.mode == "lerobot-schedulers":
        lerobot_schedulers(args.dir)
        return 0
    if args.mode == "lerobot-check-ema":
        return 0 if lerobot_check_ema(args.dir) else 1
    work = args.dir or Path(tempfile.mkdtemp(prefix="diffusion-interop-"))
    work.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())
    for v in variants:
        ours_write(work, v)
    ours_write_ema(work)
    flags = [arg for v in variants for arg in ("--variant", v)]
    lerobot = subprocess.run([args.lerobot_python, me, "lerobot-check", str(work), *flags], check=False)
    schedulers = subprocess.run(
        [args.lerobot_python, me, "lerobot-schedulers", str(work / "schedulers.safetensors")], check=False
    )
    ema = subprocess.run([args.lerobot_python, me, "lerobot-check-ema", str(work)], check=False)
    lerobot_ok = lerobot.returncode == 0 and schedulers.returncode == 0 and ema.returncode == 0
    ours_ok = all([ours_check(work, v) for v in variants])  # noqa: C419 - check every variant
    ours_ok = ours_schedulers(work / "schedulers.safetensors") and ours_ok
    print(
        f"LeRobot loads ours: {'PASS' if lerobot_ok else 'FAIL'}; we load LeRobot's: "
        f"{'PASS' if ours_ok else 'FAIL'}"
    )
    return 0 if lerobot_ok and ours_ok else 1


if __name__ == "__main__":
    sys.exit(main())
