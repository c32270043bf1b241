"""FastWAMPolicy's training loss and action inference (policies/fastwam/modeling.py) on a tiny FastWAM.

``variant=tiny`` (tiny DiTs, a tiny Wan2.2-shaped VAE and UMT5 built from config under a fixed seed) and the
tests' byte-level UMT5 tokenizer: no network, no download. The references here are compositions of the
pieces the policy is made of (``video.stack_video``, the VAE and prompt encoder, ``loss.draw_targets``,
``FastWAMModel.predict`` / ``prefill`` / ``predict_action``, ``FlowSchedule``), each compared with LeRobot's
own by the interop drivers; tools/interop/fastwam_policy_lerobot_interop.py compares the whole policy with
LeRobot 0.6.1's (loss, parts, gradients, action chunks).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import attrs
import pytest
import torch
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies.fastwam import modeling
from lerobot_cli.policies.fastwam.config import FastWAMConfig
from lerobot_cli.policies.fastwam.contexts import precompute_task_contexts
from lerobot_cli.policies.fastwam.dit_configs import tiny_dit_configs
from lerobot_cli.policies.fastwam.frozen import build_frozen_parts
from lerobot_cli.policies.fastwam.loss import action_loss, draw_targets, video_loss
from lerobot_cli.policies.fastwam.modeling import FastWAMPolicy
from lerobot_cli.policies.fastwam.schedule import FlowSchedule
from lerobot_cli.policies.fastwam.sources import FrozenPartUnavailableError
from lerobot_cli.policies.fastwam.video import stack_video
from lerobot_trainloop.testing import HostSyncCounter

B, FRAMES, HORIZON, ACTION_DIM, STATE_DIM = 3, 5, 8, 2, 3
CAMERA = "observation.images.top"
TASKS = ["reach the red target", "push the blue block", "reach the red target"]
# Train and inference shifts all differ, so a schedule read from the wrong place changes the numbers.
VIDEO_SCHEDULE = {"train_shift": 3.0, "infer_shift": 7.0, "num_train_timesteps": 1000}
ACTION_SCHEDULE = {"train_shift": 2.0, "infer_shift": 6.0, "num_train_timesteps": 800}
LOSS = {"lambda_video": 0.5, "lambda_action": 2.0}


def _tokenizer_helper():
    spec = importlib.util.spec_from_file_location(
        "fastwam_policy_umt5_tokenizer", Path(__file__).with_name("umt5_tokenizer.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return _tokenizer_helper().save_tiny_umt5_tokenizer(tmp_path_factory.mktemp("umt5_tokenizer"))


def tiny_config(tokenizer_dir: Path, **overrides) -> FastWAMConfig:
    settings = {
        "variant": "tiny",
        "torch_dtype": "float32",
        "action_dim": ACTION_DIM,
        "proprio_dim": STATE_DIM,
        "num_video_frames": FRAMES,
        "action_video_freq_ratio": 1,
        "action_horizon": HORIZON,
        "n_action_steps": 5,
        "image_size": (32, 64),
        "num_inference_steps": 4,
        "tokenizer_model_id": str(tokenizer_dir),
        "tokenizer_max_len": 128,  # the byte-level template is 85 tokens: room for the task
        "video_scheduler": VIDEO_SCHEDULE,
        "action_scheduler": ACTION_SCHEDULE,
        "loss": LOSS,
        "input_features": {
            CAMERA: PolicyFeature(FeatureType.VISUAL, (3, 32, 64)),
            "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,)),
        },
        "output_features": {"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))},
        **overrides,
    }
    return FastWAMConfig(**settings)


def tiny_policy(tokenizer_dir: Path, seed: int = 0, **overrides) -> FastWAMPolicy:
    """A seeded tiny policy whose constant-built parameters (norm scales, zero biases, Wan's zero video
    head) are made random, so no output or gradient rests on a zero."""
    torch.manual_seed(seed)
    policy = FastWAMPolicy(tiny_config(tokenizer_dir, **overrides))
    with torch.no_grad():
        for p in policy.parameters():
            if bool((p == p.flatten()[0]).all()):
                p.add_(0.1 * torch.randn_like(p))
    return policy


@pytest.fixture(scope="module")
def policy(tokenizer_dir) -> FastWAMPolicy:
    return tiny_policy(tokenizer_dir)


def training_batch(seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    action_is_pad = torch.zeros(B, HORIZON, dtype=torch.bool)
    action_is_pad[1, 5:] = True
    return {
        CAMERA: torch.rand(B, FRAMES, 3, 48, 48, generator=g),  # resized to 32x64 by the policy
        "observation.state": torch.randn(B, FRAMES, STATE_DIM, generator=g),
        "action": torch.randn(B, HORIZON, ACTION_DIM, generator=g),
        "action_is_pad": action_is_pad,
        "task": list(TASKS),
    }


def live_batch(seed: int = 2, size: int = 2) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        CAMERA: torch.rand(size, 3, 48, 48, generator=g),
        "observation.state": torch.randn(size, STATE_DIM, generator=g),
        "task": TASKS[:size],
    }


def prompts(tasks, config: FastWAMConfig) -> list[str]:
    return [config.prompt_template.format(task=t) for t in tasks]


def reference_loss(policy: FastWAMPolicy, batch: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lambda-weighted video loss, lambda-weighted action loss)`` from the pieces, LeRobot's order."""
    config, frozen = policy.config, policy.frozen
    video = stack_video(batch, image_size=config.image_size, model_video_frames=config.model_video_frames)
    latents = frozen.vae.encode(video.float() * 2.0 - 1.0)
    context, mask = frozen.prompts.encode(prompts(batch["task"], config))
    context, mask = policy.model.append_proprio(context, mask, batch["observation.state"][:, 0])
    video_schedule = FlowSchedule(1000, 3.0)
    action_schedule = FlowSchedule(800, 2.0)
    torch.manual_seed(seed)
    targets = draw_targets(latents, batch["action"], video_schedule, action_schedule, True)
    pred_video, pred_action = policy.model.predict(
        targets.latents,
        targets.timestep_video,
        targets.noisy_action,
        targets.timestep_action,
        context,
        mask,
        video_actions=batch["action"],
    )
    loss_video = video_loss(pred_video, targets.target_video, targets.timestep_video, video_schedule, True)
    loss_action = action_loss(
        pred_action, targets.target_action, targets.timestep_action, action_schedule, batch["action_is_pad"]
    )
    return 0.5 * loss_video, 2.0 * loss_action


# -- training -------------------------------------------------------------------------------------------


def test_forward_is_lerobots_loss_from_the_cameras_prompt_and_first_state(policy):
    """Cameras → video in [-1, 1] → VAE latents; the prompt template around each task through UMT5; the
    state's frame 0 as the proprio token; the training shifts; lambda-weighted parts summed."""
    batch = training_batch()
    video, action = reference_loss(policy, batch, seed=5)
    torch.manual_seed(5)
    loss, parts = policy(batch)
    assert set(parts) == {"loss_video", "loss_action"}
    assert torch.equal(parts["loss_video"], video) and torch.equal(parts["loss_action"], action)
    assert torch.equal(loss, video + action)
    assert float(video.detach()) > 0 and float(action.detach()) > 0


def test_parts_are_detached_tensors_and_the_step_reads_no_device_value(policy):
    """The loop forbids host syncs in a step: the parts are 0-d detached tensors, and forward + backward
    read nothing back with the batch's context or precomputed task contexts. Through UMT5, our code reads
    nothing either (the padding is zeroed on the device, not row by row at each prompt's length read back:
    one read per row before); transformers' mask builder reads one bool per prompt batch (``padding_mask
    .all()`` in ``masking_utils``), which ``precompute_task_contexts`` keeps out of the step."""
    batch = training_batch()
    context, mask = policy.frozen.prompts.encode(prompts(batch["task"], policy.config))
    contexts = precompute_task_contexts(TASKS, policy.frozen.prompts, template=policy.config.prompt_template)
    cases = (
        ({"context": context, "context_mask": mask}, None, []),
        ({}, contexts, []),
        ({}, None, ["__bool__"]),
    )
    for extra, task_contexts, reads in cases:
        policy.use_task_contexts(task_contexts)
        try:
            with HostSyncCounter() as counter:
                loss, parts = policy({**batch, **extra})
                loss.backward()
        finally:
            policy.use_task_contexts(None)
            policy.zero_grad(set_to_none=True)
        assert counter.syncs(any_label=True) == reads
        for part in parts.values():
            assert isinstance(part, torch.Tensor) and part.ndim == 0 and not part.requires_grad


def test_context_comes_from_the_batch_then_task_contexts_then_the_prompt(policy):
    batch = training_batch()
    context, mask = policy.frozen.prompts.encode(prompts(batch["task"], policy.config))
    contexts = precompute_task_contexts(TASKS, policy.frozen.prompts, template=policy.config.prompt_template)
    torch.manual_seed(3)
    encoded = policy(batch)[0]
    real_encode = policy.frozen.prompts.encode
    policy.frozen.prompts.encode = None  # the prompt encoder must not be asked: calling it would fail
    try:
        # the batch's own context (LeRobot's batch accepts context/context_mask), and it is used
        torch.manual_seed(3)
        assert torch.equal(policy({**batch, "context": context, "context_mask": mask})[0], encoded)
        torch.manual_seed(3)
        assert not torch.equal(
            policy({**batch, "context": context.roll(1, 0), "context_mask": mask})[0], encoded
        )
        # precomputed per task: each batch row gets its task's row
        policy.use_task_contexts(contexts)
        looked_up, ones = contexts.lookup(batch["task"])
        torch.manual_seed(3)
        from_contexts = policy(batch)[0]
        torch.manual_seed(3)
        assert torch.equal(from_contexts, policy({**batch, "context": looked_up, "context_mask": ones})[0])
        assert torch.allclose(from_contexts, encoded, atol=1e-6, rtol=0)
        with pytest.raises(ValueError, match="no precomputed context for task"):
            policy({**batch, "task": ["an unknown task"] * B})
        with pytest.raises(ValueError, match="made with the prompt template 'x: {task}'"):
            policy.use_task_contexts(attrs.evolve(contexts, template="x: {task}"))
    finally:
        policy.use_task_contexts(None)
        policy.frozen.prompts.encode = real_encode


def test_precomputed_task_contexts_train_without_umt5_and_inference_builds_it(tokenizer_dir):
    """``precompute_task_contexts``: the policy is built without UMT5; the training hook encodes each task
    once (here one process) and the loss is the encoded one's; the text encoder is held by no rank. At
    inference, with no contexts, UMT5 is built at the first prompt: the same weights, the same chunk as a
    policy built with it."""
    from lerobot_cli.policies.training_run import TrainingRun

    with_encoder = tiny_policy(tokenizer_dir)
    precomputing = tiny_policy(tokenizer_dir, precompute_task_contexts=True)
    assert with_encoder.frozen.prompts is not None and precomputing.frozen.prompts is None
    tasks = ("an unused task", *TASKS)  # TASKS names one task twice: one row each
    lines = precomputing.config.prepare_training(precomputing, TrainingRun(tasks, torch.device("cpu")))
    assert lines == [
        (
            "Task contexts: 3 task(s) encoded once on rank 0, 0.05 MiB per rank; the text encoder (0.13 MiB) "
            "is held by 0 of 1 rank(s) while training (--policy.precompute_task_contexts=true)"
        )
    ]
    assert precomputing.frozen.prompts is None
    assert precomputing.task_contexts.tasks == ("an unused task", *dict.fromkeys(TASKS))
    batch = training_batch()
    torch.manual_seed(3)
    reference = with_encoder(batch)[0]
    torch.manual_seed(3)
    assert torch.allclose(precomputing(batch)[0], reference, atol=1e-6, rtol=0)
    assert precomputing.frozen.prompts is None
    # the hook does nothing without the switch
    assert with_encoder.config.prepare_training(with_encoder, TrainingRun(tasks, torch.device("cpu"))) == []
    assert with_encoder.task_contexts is None

    precomputing.use_task_contexts(None)
    chunk = precomputing.predict_action_chunk(live_batch())
    built = precomputing.frozen.prompts
    assert built is not None
    reference_weights = with_encoder.frozen.prompts.encoder.state_dict()
    assert all(torch.equal(t, reference_weights[k]) for k, t in built.encoder.state_dict().items())
    assert torch.equal(chunk, with_encoder.predict_action_chunk(live_batch()))


def test_action_padding_masks_the_action_loss_only(policy):
    """``action_is_pad`` reaches the action loss (the reference test pins its exact use); the video loss
    ignores it, and a batch without it counts every step."""
    batch = training_batch()
    torch.manual_seed(9)
    _, padded = policy(batch)
    torch.manual_seed(9)
    _, unpadded = policy({k: v for k, v in batch.items() if k != "action_is_pad"})
    assert torch.equal(padded["loss_video"], unpadded["loss_video"])
    assert not torch.equal(padded["loss_action"], unpadded["loss_action"])


def test_with_dataset_indices_each_sample_draws_the_same_wherever_it_lands(policy):
    """With ``index`` (every dataset batch has it) a sample's noise and timesteps follow the sample, not its
    place in the batch or which rank holds it: the loss of a batch is the mean of its halves' losses, each
    half from the same global RNG state (every rank seeds alike), and does not change when the batch is
    reordered. Without ``index`` the draws follow the position (LeRobot's global RNG)."""
    batch = training_batch()
    batch = {k: (v[[0, 1, 2, 0]] if isinstance(v, torch.Tensor) else [*v, v[0]]) for k, v in batch.items()}
    batch["index"] = torch.tensor([10, 11, 12, 13])

    def parts(b):
        torch.manual_seed(21)
        _, out = policy(b)
        return torch.stack([out["loss_video"], out["loss_action"]])

    def subset(rows):
        return {
            k: (v[rows] if isinstance(v, torch.Tensor) else [v[i] for i in rows]) for k, v in batch.items()
        }

    whole = parts(batch)
    halves = (parts(subset([0, 1])) + parts(subset([2, 3]))) / 2
    assert torch.allclose(whole, halves, rtol=1e-6, atol=0), (whole, halves)
    assert torch.allclose(parts(subset([3, 1, 0, 2])), whole, rtol=1e-6, atol=0)
    # samples 0 and 3 are the same frames: with their own indices they draw differently
    assert not torch.allclose(parts(subset([0, 1])), parts(subset([3, 1])), rtol=1e-6, atol=0)
    del batch["index"]
    assert not torch.allclose(parts(subset([3, 1, 0, 2])), parts(batch), rtol=1e-3, atol=0)


def test_the_index_path_is_draw_targets_per_sample_under_its_own_seed(policy, monkeypatch):
    """Each sample's draws are ``loss.draw_targets``'s (LeRobot's order, the clean first frame) under a
    seed made of one global draw and the sample's index."""
    batch = {k: v[2:] for k, v in training_batch().items()}  # the last sample (tensors and tasks)
    batch["index"] = torch.tensor([7])
    seen = []
    real = policy.model.predict
    monkeypatch.setattr(policy.model, "predict", lambda *args, **kw: seen.append(args) or real(*args, **kw))
    torch.manual_seed(21)
    policy(batch)
    torch.manual_seed(21)
    base = int(torch.randint(0, 2**62, ()))
    video = stack_video(batch, image_size=policy.config.image_size, model_video_frames=FRAMES)
    latents = policy.frozen.vae.encode(video * 2.0 - 1.0)
    torch.manual_seed((base + 0x9E3779B97F4A7C15 * 8) % 2**63)
    expected = draw_targets(latents, batch["action"], FlowSchedule(1000, 3.0), FlowSchedule(800, 2.0), True)
    got = seen[0]
    for i, name in enumerate(("latents", "timestep_video", "noisy_action", "timestep_action")):
        assert torch.equal(got[i], getattr(expected, name)), name


def test_gradients_reach_the_trainable_parameters_only(tokenizer_dir):
    policy = tiny_policy(tokenizer_dir, freeze_video_expert=True)
    loss, _ = policy(training_batch())
    loss.backward()
    trainable = {id(p) for p in policy.get_optim_params()}
    for name, p in policy.named_parameters():
        if id(p) in trainable:
            assert p.grad is not None and bool(p.grad.abs().sum() > 0), name
        else:
            assert p.grad is None, name
    for module in policy.frozen.modules():
        assert all(p.grad is None and not p.requires_grad for p in module.parameters())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({CAMERA: torch.rand(B, 4, 3, 48, 48)}, r"the video has 4 frames; the Wan VAE needs 4k \+ 1"),
        ({"video": torch.rand(B, 3, 5, 40, 64)}, r"height and width must be multiples of 16, got 40x64"),
        (
            {"video": torch.rand(B, 3, 5, 32)},
            r"the FastWAM video must be \[B, 3, T, H, W\], got \[3, 3, 5, 32\]",
        ),
        ({"action": torch.randn(B, 6, ACTION_DIM)}, r"action horizon 6 must be divisible by the video's 4"),
        ({"action": torch.randn(B, ACTION_DIM)}, r"the action must be \[B, horizon, dim\] with B = 3"),
        (
            {"action_is_pad": torch.zeros(B, 4, dtype=torch.bool)},
            r"action_is_pad must be \[B, T\] = \[3, 8\]",
        ),
        ({"image_is_pad": torch.zeros(B, 9, dtype=torch.bool)}, r"image_is_pad must be \[B, T\] = \[3, 5\]"),
        ({"task": None}, r"needs the batch's task \(or prompt\) to encode"),
        ({"observation.state": None}, r"--policy.proprio_dim=3 needs observation.state"),
        ({"observation.state": torch.randn(B, 2)}, r"observation.state must be \[B, 3\] or \[B, T, 3\]"),
        ({"context": torch.randn(B, 4), "context_mask": torch.ones(B, 4, dtype=torch.bool)}, r"\[B, L, D\]"),
    ],
)
def test_malformed_batches_fail_in_one_line(policy, change, message):
    batch = {k: v for k, v in {**training_batch(), **change}.items() if v is not None}
    with pytest.raises((ValueError, KeyError), match=message) as exc:
        policy(batch)
    assert "\n" not in str(exc.value)


def test_without_a_text_encoder_the_batch_must_carry_the_context(tokenizer_dir):
    policy = tiny_policy(tokenizer_dir, load_text_encoder=False)
    assert policy.frozen.prompts is None
    with pytest.raises(ValueError, match=r"load_text_encoder=false: batches must carry context/context_mask"):
        policy(training_batch())
    batch = training_batch()
    loss, _ = policy(
        {**batch, "context": torch.randn(B, 6, 32), "context_mask": torch.ones(B, 6, dtype=bool)}
    )
    assert loss.ndim == 0


# -- frozen parts ---------------------------------------------------------------------------------------


def test_frozen_parts_are_outside_the_module_and_follow_its_device(tokenizer_dir):
    policy = tiny_policy(tokenizer_dir)
    frozen_ids = {id(p) for m in policy.frozen.modules() for p in m.parameters()}
    assert not frozen_ids & {id(p) for p in policy.parameters()}
    assert not any(k.startswith("frozen") for k in policy.state_dict())
    assert policy.frozen.vae.device.type == "cpu"
    policy.to("meta")  # the parameters move (a rank's device); the frozen parts follow at their next use
    assert policy.frozen.vae.device.type == "cpu"
    frozen = policy.frozen_parts()
    assert frozen.vae.device.type == "meta"
    assert next(frozen.prompts.encoder.parameters()).device.type == "meta"


def test_an_ema_copy_shares_the_frozen_parts_and_compiles_its_own_step(tokenizer_dir, monkeypatch):
    import copy

    monkeypatch.setattr(modeling.torch, "compile", lambda fn, **kwargs: fn)
    policy = tiny_policy(tokenizer_dir, compile_action_infer=True)
    policy.predict_action_chunk(live_batch())
    assert policy._compiled.step is not None
    shadow = copy.deepcopy(policy)  # what --ema.* keeps
    assert shadow.frozen is policy.frozen  # 11 GB of UMT5 at full size: read-only, never copied
    assert shadow._compiled.step is None  # its own compiled step, of its own model, at its first use
    shadow.predict_action_chunk(live_batch())
    assert shadow._compiled.step is not None and shadow._compiled.step != policy._compiled.step


def test_on_the_meta_device_the_frozen_parts_wait_for_their_first_use(tmp_path):
    config = tiny_config(tmp_path / "no_tokenizer_here")
    with torch.device("meta"):
        policy = FastWAMPolicy(config)  # a dry run plans the networks without any frozen part
    assert policy.frozen is None
    with pytest.raises(FrozenPartUnavailableError, match=r"--policy.tokenizer_model_id=.*no such directory"):
        policy.frozen_parts()


def test_tiny_frozen_parts_are_the_same_in_every_process_and_leave_the_rng_alone(tokenizer_dir):
    config = tiny_config(tokenizer_dir)
    torch.manual_seed(1)
    first = build_frozen_parts(config)
    after = torch.rand(3)
    torch.manual_seed(2)
    second = build_frozen_parts(config)
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3), after)  # building drew nothing from the global RNG
    for a, b in zip(first.modules(), second.modules(), strict=True):
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert torch.equal(x, y), name


def test_the_full_variant_loads_its_frozen_parts_from_their_sources(tokenizer_dir, tmp_path, monkeypatch):
    """variant=full: the VAE from LeRobot's Wan2.2 repository in the Hugging Face cache, UMT5 from
    ``text_encoder_model_id`` (here a local directory), the tokenizer from ``tokenizer_model_id``; tiny
    weights stand in for them. An empty cache is one line (sources.py's), before any frozen weight."""
    from lerobot_cli.policies.fastwam.sources import WAN22_DIFFUSERS_MODEL_ID
    from lerobot_cli.policies.fastwam.text import build_umt5_encoder, tiny_umt5_config
    from lerobot_cli.policies.fastwam.vae import build_wan_vae, tiny_wan_vae_config

    cache = tmp_path / "hub"
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    video, action = tiny_dit_configs(ACTION_DIM)
    config = tiny_config(
        tokenizer_dir,
        variant="full",
        text_encoder_model_id=str(tmp_path / "umt5"),
        video_dit_config=video,
        action_dit_config=action,
    )
    with pytest.raises(FrozenPartUnavailableError) as exc:
        FastWAMPolicy(config)
    assert str(exc.value).startswith(f"{WAN22_DIFFUSERS_MODEL_ID}: the Wan2.2 VAE is not in the Hugging Face")
    assert "\n" not in str(exc.value)

    repo = cache / f"models--{WAN22_DIFFUSERS_MODEL_ID.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    torch.manual_seed(3)
    vae = build_wan_vae(tiny_wan_vae_config())
    vae.autoencoder.save_pretrained(str(repo / "snapshots" / "0123abcd" / "vae"))
    encoder = build_umt5_encoder(tiny_umt5_config(d_model=32))
    encoder.save_pretrained(str(tmp_path / "umt5" / "text_encoder"))
    policy = FastWAMPolicy(config)
    for ours, saved in ((policy.frozen.vae, vae), (policy.frozen.prompts.encoder, encoder)):
        mine = ours.state_dict()
        assert all(torch.equal(mine[k], v) for k, v in saved.state_dict().items())
    loss, _ = policy(training_batch())
    assert torch.isfinite(loss)


def test_tiny_networks_and_frozen_parts_unless_networks_are_given(tokenizer_dir):
    config = tiny_config(tokenizer_dir)
    assert config.video_dit_config["hidden_dim"] == 32 and config.action_dit_config["hidden_dim"] == 24
    assert FastWAMConfig(variant="full").video_dit_config["hidden_dim"] == 3072
    video = dict(config.video_dit_config, hidden_dim=64, attn_head_dim=32)
    action = dict(config.action_dit_config, attn_head_dim=32)
    assert (
        tiny_config(tokenizer_dir, video_dit_config=video, action_dit_config=action).video_dit_config[
            "hidden_dim"
        ]
        == 64
    )
    with pytest.raises(
        ValueError, match=r"--policy.variant: invalid choice 'small' \(choose from full, tiny\)"
    ):
        tiny_config(tokenizer_dir, variant="small")


# -- inference ------------------------------------------------------------------------------------------


def reference_chunk(policy: FastWAMPolicy, batch: dict, index: int, seed: int | None) -> torch.Tensor:
    """One sample's chunk from the pieces: noise from the seeded generator, the first frame's latents, the
    prefill, Euler steps on the action schedule's inference shift."""
    config, frozen = policy.config, policy.frozen
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    latents = torch.randn((1, HORIZON, ACTION_DIM), generator=generator)
    image = torch.nn.functional.interpolate(
        batch[CAMERA][index : index + 1], size=(32, 64), mode="bilinear", antialias=True
    )
    first = frozen.vae.encode((image * 2.0 - 1.0).unsqueeze(2))
    context, mask = frozen.prompts.encode(prompts([batch["task"][index]], config))
    context, mask = policy.model.append_proprio(context, mask, batch["observation.state"][index : index + 1])
    cache = policy.model.prefill(first, context, mask, HORIZON)
    timesteps, deltas = FlowSchedule(800, 6.0).inference_steps(4, "cpu", torch.float32)
    for t, d in zip(timesteps, deltas, strict=True):
        velocity = policy.model.predict_action(cache, latents, t.unsqueeze(0), context, mask)
        latents = FlowSchedule.euler(velocity, d, latents)
    return latents


def test_predict_action_chunk_is_lerobots_cached_euler_inference(policy):
    batch = live_batch()
    chunk = policy.predict_action_chunk(batch)
    assert chunk.shape == (2, HORIZON, ACTION_DIM) and chunk.dtype == torch.float32
    for i in range(2):
        assert torch.equal(chunk[i : i + 1], reference_chunk(policy, batch, i, seed=42))
    assert not policy.training


def test_every_sample_is_inferred_alone_from_the_same_seeded_noise(policy):
    batch = live_batch(size=3)
    chunk = policy.predict_action_chunk(batch)
    for i in range(3):
        alone = {k: v[i : i + 1] for k, v in batch.items()}  # tensors and the task list
        assert torch.equal(policy.predict_action_chunk(alone), chunk[i : i + 1])
    twice = {
        k: (v[:1].repeat(2, *[1] * (v.ndim - 1)) if isinstance(v, torch.Tensor) else v[:1] * 2)
        for k, v in batch.items()
    }
    pair = policy.predict_action_chunk(twice)
    assert torch.equal(pair[0], pair[1])  # LeRobot re-seeds its generator for every sample


def test_inference_seed_and_the_batchs_overrides(policy):
    batch = live_batch()
    seeded = policy.predict_action_chunk(batch)
    assert torch.equal(policy.predict_action_chunk(batch), seeded)
    assert not torch.equal(policy.predict_action_chunk({**batch, "seed": 7}), seeded)
    assert torch.equal(
        policy.predict_action_chunk({**batch, "seed": 7})[:1], reference_chunk(policy, batch, 0, 7)
    )
    unseeded = attrs.evolve(policy.config, inference_seed=None)
    policy.config, config = unseeded, policy.config
    try:
        torch.manual_seed(11)
        first = policy.predict_action_chunk(batch)
        torch.manual_seed(11)
        assert torch.equal(policy.predict_action_chunk(batch), first)  # the global RNG
        torch.manual_seed(11)
        assert torch.equal(first[:1], reference_chunk(policy, batch, 0, None))
    finally:
        policy.config = config
    fewer = policy.predict_action_chunk({**batch, "num_inference_steps": 2})
    assert not torch.equal(fewer, seeded)


def test_bf16_policy_returns_float32_actions(tokenizer_dir):
    policy = tiny_policy(tokenizer_dir, torch_dtype="bfloat16")
    assert policy.frozen.vae.dtype == torch.bfloat16
    chunk = policy.predict_action_chunk(live_batch())
    assert chunk.dtype == torch.float32 and torch.isfinite(chunk).all()


def test_select_action_pops_n_action_steps_from_each_chunk(policy, monkeypatch):
    calls = []
    real = policy.predict_action_chunk

    def counted(batch):
        calls.append(1)
        return real(batch)

    monkeypatch.setattr(policy, "predict_action_chunk", counted)
    policy.reset()
    batch = live_batch()
    chunk = real(batch)
    actions = [policy.select_action(batch) for _ in range(7)]
    assert len(calls) == 2  # n_action_steps = 5: a new chunk at the 6th step
    assert all(torch.equal(a, chunk[:, i]) for i, a in enumerate(actions[:5]))
    assert torch.equal(actions[5], chunk[:, 0])
    policy.reset()
    policy.select_action(batch)
    assert len(calls) == 3


def test_compile_action_infer_compiles_the_cached_action_step_once(tokenizer_dir, monkeypatch):
    compiled = []

    def fake_compile(fn, **kwargs):
        compiled.append(kwargs)
        return fn

    monkeypatch.setattr(modeling.torch, "compile", fake_compile)
    policy = tiny_policy(tokenizer_dir, compile_action_infer=True)
    policy.predict_action_chunk(live_batch())
    policy.predict_action_chunk(live_batch())
    assert compiled == [{"mode": None, "fullgraph": True}]  # CPU: no CUDA graphs
    plain = tiny_policy(tokenizer_dir)
    plain.predict_action_chunk(live_batch())
    assert len(compiled) == 1


@pytest.mark.slow
def test_compiled_action_inference_equals_eager(tokenizer_dir):
    """A real torch.compile (inductor, fullgraph) of the cached action step: ~10-50 s on 2 CPU cores."""
    eager = tiny_policy(tokenizer_dir)
    compiled = tiny_policy(tokenizer_dir, compile_action_infer=True)
    batch = live_batch()
    expected = eager.predict_action_chunk(batch)
    for _ in range(2):
        assert torch.allclose(compiled.predict_action_chunk(batch), expected, atol=1e-5, rtol=0)
