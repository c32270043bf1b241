"""FastWAM's frozen parts (policies/fastwam/vae.py, text.py, contexts.py, frozen.py, sources.py).

Tiny models built from config (a Wan2.2-shaped VAE of 288k parameters, a 2-layer UMT5) and the tiny
byte-level UMT5 tokenizer of umt5_tokenizer.py: no network, no download. Expected values are computed
here from diffusers' / transformers' own modules and the config's statistics, so a change in the
scaling, the dtype order or the context building fails; tools/interop/fastwam_processor_lerobot_interop.py
compares the same functions with LeRobot 0.6.1's.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lerobot_cli.policies.fastwam.contexts import TaskContexts, TaskContextsError, precompute_task_contexts
from lerobot_cli.policies.fastwam.frozen import FrozenParts
from lerobot_cli.policies.fastwam.sources import (
    TEXT_ENCODER,
    TOKENIZER,
    VAE,
    FrozenPartUnavailableError,
    resolve_frozen_sources,
    resolve_part,
)
from lerobot_cli.policies.fastwam.text import (
    PROMPT_TEMPLATE,
    UMT5_XXL_CONFIG,
    PromptEncoder,
    batch_prompts,
    build_umt5_encoder,
    load_umt5_encoder,
    load_umt5_tokenizer,
    tiny_umt5_config,
    umt5_parameter_count,
)
from lerobot_cli.policies.fastwam.vae import (
    build_wan_vae,
    load_wan_vae,
    tiny_wan_vae_config,
    wan_vae_parameter_count,
)

MAX_LEN = 128  # LeRobot's tokenizer_max_len: longer than the template, so tasks differ in their context
TASKS = [
    "pick up the red cube",
    "open the drawer",
    "a task long enough to be cut at the tokenizer's max length, given the template before it",
]


def umt5_tokenizer_helper():
    """tests/umt5_tokenizer.py, loaded by path (the tests are not a package)."""
    spec = importlib.util.spec_from_file_location(
        "fastwam_umt5_tokenizer", Path(__file__).with_name("umt5_tokenizer.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return umt5_tokenizer_helper().save_tiny_umt5_tokenizer(tmp_path_factory.mktemp("umt5_tokenizer"))


@pytest.fixture(scope="module")
def prompts(tokenizer_dir) -> PromptEncoder:
    torch.manual_seed(0)
    return PromptEncoder(load_umt5_tokenizer(tokenizer_dir), build_umt5_encoder(tiny_umt5_config()), MAX_LEN)


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(0)
    return build_wan_vae(tiny_wan_vae_config())


def video(seed: int = 0, frames: int = 5) -> torch.Tensor:
    return torch.rand(2, 3, frames, 32, 64, generator=torch.Generator().manual_seed(seed))


def statistics(dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    config = tiny_wan_vae_config()
    shape = (1, 48, 1, 1, 1)
    return (
        torch.tensor(config["latents_mean"], dtype=dtype).view(shape),
        torch.tensor(config["latents_std"], dtype=dtype).view(shape),
    )


# ---------------------------------------------------------------- the VAE


def test_latents_are_the_posterior_mode_standardised_by_the_configs_statistics(vae):
    pixels = video() * 2 - 1
    mean, std = statistics()
    mu = vae.autoencoder.encode(pixels).latent_dist.mode()
    latents = vae.encode(pixels)
    assert latents.shape == (2, 48, 2, 2, 4)  # 5 frames -> 2, 32x64 -> 2x4
    torch.testing.assert_close(latents, (mu - mean) / std, atol=0, rtol=0)
    # and back: de-standardised, decoded, clamped float32 pixels
    decoded = vae.decode(latents)
    torch.testing.assert_close(
        decoded, vae.autoencoder.decode(latents * std + mean).sample.clamp(-1, 1), atol=1e-6, rtol=0
    )
    assert decoded.dtype == torch.float32 and decoded.shape == pixels.shape


def test_under_bf16_the_scaling_is_float32_and_the_video_is_cast_before_it_is_mapped():
    torch.manual_seed(0)
    vae = build_wan_vae(tiny_wan_vae_config(), dtype=torch.bfloat16)
    frames = video(1)
    mean, std = statistics()
    # LeRobot's build_inputs: the [0, 1] video cast to the model dtype first, then mapped to [-1, 1] in it
    mu = vae.autoencoder.encode(frames.to(torch.bfloat16) * 2 - 1).latent_dist.mode()
    latents = vae.encode_video(frames)
    assert latents.dtype == torch.float32
    assert torch.equal(latents, (mu.float() - mean) / std)
    assert not torch.equal(latents, vae.encode(frames * 2 - 1))  # mapped in float32 first: other latents
    # the inference image is mapped in its own dtype (float32 here) and cast by the encoder
    image = frames[:1, :, 0]
    mu = vae.autoencoder.encode((image * 2 - 1).to(torch.bfloat16).unsqueeze(2)).latent_dist.mode()
    assert torch.equal(vae.encode_image(image), (mu.float() - mean) / std)


def test_tiled_encoding_is_refused_as_lerobot_refuses_it(vae):
    with pytest.raises(NotImplementedError, match="tiled=false"):
        vae.encode(video() * 2 - 1, tiled=True)
    with pytest.raises(NotImplementedError, match="tiled=false"):
        vae.decode(torch.zeros(1, 48, 1, 2, 4), tiled=True)


def test_the_statistics_are_float32_buffers_outside_any_state_dict(vae):
    assert vae.latents_mean.dtype == torch.float32 and vae.latents_mean.shape == (1, 48, 1, 1, 1)
    assert not any(k.startswith("latents_") for k in vae.state_dict())


# ---------------------------------------------------------------- frozen, and outside the policy


class PolicyLike(torch.nn.Module):
    def __init__(self, frozen: FrozenParts) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 4)
        self.frozen = frozen


def test_frozen_parts_are_in_no_state_dict_optimizer_or_module_walk(vae, prompts):
    policy = PolicyLike(FrozenParts(vae, prompts))
    assert set(policy.state_dict()) == {"head.weight", "head.bias"}
    assert len(list(policy.parameters())) == 2  # what an optimizer and DDP see
    assert [name for name, _ in policy.named_modules()] == ["", "head"]  # what an FSDP wrap walk sees
    for module in policy.frozen.modules():
        assert not module.training
        assert not any(p.requires_grad for p in module.parameters())
    policy.train()
    vae.train()  # a frozen part ignores train()
    assert not vae.training and not prompts.encoder.training
    shadow = copy.deepcopy(policy)  # an EMA copy shares the frozen parts instead of copying them
    assert shadow.frozen is policy.frozen and shadow.head is not policy.head


def test_loaded_parts_come_back_frozen(tmp_path, vae, prompts):
    vae.autoencoder.save_pretrained(tmp_path / "vae")
    prompts.encoder.save_pretrained(tmp_path / "text_encoder")
    loaded = load_wan_vae(tmp_path / "vae", dtype=torch.float32)
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())
    pixels = video(2) * 2 - 1
    assert torch.equal(loaded.encode(pixels), vae.encode(pixels))
    encoder = load_umt5_encoder(tmp_path / "text_encoder", dtype=torch.float32)
    assert not encoder.training and not any(p.requires_grad for p in encoder.parameters())


# ---------------------------------------------------------------- the text context


def test_the_context_is_the_encoder_output_with_padding_zeroed_and_a_full_mask(prompts):
    texts = [PROMPT_TEMPLATE.format(task=t) for t in TASKS[:2]] + ["short"]
    ids, mask = prompts.tokenize(texts)
    assert ids.shape == (3, MAX_LEN) and mask[2].sum() == len("short") + 1  # bytes + </s>
    context, context_mask = prompts.encode(texts)
    assert context.shape == (3, MAX_LEN, 32)
    assert context_mask.dtype == torch.bool and bool(context_mask.all())
    raw = prompts.encoder(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    for row in range(3):
        length = int(mask[row].sum())
        torch.testing.assert_close(context[row, :length], raw[row, :length], atol=0, rtol=0)
        assert not context[row, length:].any()
    assert length < MAX_LEN  # the short prompt really had padding to zero
    assert prompts.encode("short")[0].shape == (1, MAX_LEN, 32)  # padded to max_length, not to the longest


def test_umt5_attention_is_eager_as_lerobots_transformers_runs_it(prompts, tmp_path):
    """transformers 5.24 would pick SDPA, whose context is not LeRobot's (5.5: eager) to the last bit."""
    assert prompts.encoder.config._attn_implementation == "eager"
    prompts.encoder.save_pretrained(tmp_path)
    assert load_umt5_encoder(tmp_path, dtype=torch.float32).config._attn_implementation == "eager"


def test_prompts_come_from_the_batch_prompt_or_the_template():
    assert batch_prompts({"task": ["a", "b"]}) == [
        PROMPT_TEMPLATE.format(task="a"),
        PROMPT_TEMPLATE.format(task="b"),
    ]
    assert batch_prompts({"task": "a"}, "do {task}") == "do a"
    assert batch_prompts({"task": ["a"], "prompt": ["given"]}) == ["given"]
    assert batch_prompts({}) is None


def test_precomputed_contexts_equal_encoding_the_batch(prompts, tmp_path):
    table = precompute_task_contexts(
        [TASKS[1], *TASKS, TASKS[0]], prompts, batch_size=2, source={"text_encoder": "tiny"}
    )
    assert table.tasks == tuple(dict.fromkeys([TASKS[1], *TASKS]))  # each distinct task once
    batch = [TASKS[2], TASKS[0], TASKS[0], TASKS[1]]
    context, mask = table.lookup(batch)
    want, want_mask = prompts.encode(batch_prompts({"task": batch}))
    # the same prompts in other batches: equal up to the rounding of a differently sized product
    torch.testing.assert_close(context, want, atol=1e-6, rtol=0)
    assert torch.equal(mask, want_mask)
    assert table.nbytes == 3 * MAX_LEN * 32 * 4

    path = table.save(tmp_path / "contexts.safetensors")
    loaded = TaskContexts.load(
        path, template=PROMPT_TEMPLATE, source={"text_encoder": "tiny", "max_length": MAX_LEN}
    )
    assert loaded.tasks == table.tasks and torch.equal(loaded.context, table.context)
    with pytest.raises(TaskContextsError, match="prompt template"):
        TaskContexts.load(path, template="do {task}")
    with pytest.raises(TaskContextsError, match="made with"):
        TaskContexts.load(path, source={"text_encoder": "another"})
    with pytest.raises(TaskContextsError, match="no precomputed context for task"):
        table.lookup(["a task the dataset does not have"])


def test_umt5_xxl_would_hold_11_4_gb_per_rank_in_bf16():
    """The figure the precomputed contexts save on every rank (counted on the meta device)."""
    params = umt5_parameter_count(UMT5_XXL_CONFIG)
    assert params == 5_680_910_336
    assert params * torch.bfloat16.itemsize == 11_361_820_672  # 10.58 GiB
    assert wan_vae_parameter_count() == 704_688_668  # the VAE stays on every rank: 1.41 GB in bf16


# ---------------------------------------------------------------- where they come from


def write_part(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def fake_cache(root: Path, repo: str, files: dict[str, str]) -> Path:
    """A Hugging Face hub cache holding ``files`` of ``repo`` at revision main."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / "0123abcd"
    for name, text in files.items():
        write_part((snapshot / name).parent, {Path(name).name: text})
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text("0123abcd")
    return snapshot


def test_a_local_directory_is_the_repository_root_or_the_part_itself(tmp_path):
    write_part(tmp_path / "wan" / "vae", {"config.json": "{}", "diffusion_pytorch_model.safetensors": ""})
    write_part(
        tmp_path / "wan" / "text_encoder",
        {
            "config.json": "{}",
            "model.safetensors.index.json": json.dumps(
                {"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}
            ),
            "model-1.safetensors": "",
            "model-2.safetensors": "",
        },
    )
    write_part(tmp_path / "tok", {"tokenizer_config.json": "{}", "tokenizer.json": "{}"})
    assert resolve_part(str(tmp_path / "wan"), VAE) == tmp_path / "wan" / "vae"
    assert resolve_part(str(tmp_path / "wan" / "vae"), VAE) == tmp_path / "wan" / "vae"
    assert resolve_part(str(tmp_path / "wan"), TEXT_ENCODER) == tmp_path / "wan" / "text_encoder"
    assert resolve_part(str(tmp_path / "tok"), TOKENIZER) == tmp_path / "tok"
    (tmp_path / "wan" / "text_encoder" / "model-2.safetensors").unlink()
    with pytest.raises(FrozenPartUnavailableError, match="lacks model-2.safetensors"):
        resolve_part(str(tmp_path / "wan"), TEXT_ENCODER)
    with pytest.raises(FrozenPartUnavailableError, match="no such directory"):
        resolve_part(str(tmp_path / "nowhere"), VAE)
    (tmp_path / "wan" / "vae" / "config.json").unlink()
    with pytest.raises(FrozenPartUnavailableError, match="lacks config.json"):
        resolve_part(str(tmp_path / "wan"), VAE)


def test_a_hub_id_is_found_in_the_cache_without_the_network(tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    snapshot = fake_cache(
        tmp_path,
        "Wan-AI/Wan2.2-TI2V-5B-Diffusers",
        {
            "vae/config.json": "{}",
            "vae/diffusion_pytorch_model.safetensors": "",
            "text_encoder/config.json": "{}",
            "text_encoder/model.safetensors": "",
        },
    )
    fake_cache(tmp_path, "google/umt5-xxl", {"tokenizer_config.json": "{}", "spiece.model": ""})
    import huggingface_hub

    calls = []
    real = huggingface_hub.snapshot_download

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", spy)
    found = resolve_frozen_sources()
    assert calls and all(call.get("local_files_only") is True for call in calls)  # never a download
    assert found.vae == snapshot / "vae" and found.text_encoder == snapshot / "text_encoder"
    assert found.tokenizer.name == "0123abcd"
    assert resolve_frozen_sources(text_encoder_model_id=None, tokenizer_model_id=None).text_encoder is None


MISSING = (
    "import sys\n"
    "from lerobot_cli.policies.fastwam.sources import FrozenPartUnavailableError, resolve_frozen_sources\n"
    "try:\n    resolve_frozen_sources()\n"
    "except FrozenPartUnavailableError as exc:\n    print(exc)\n"
    "print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))\n"
)


def test_a_missing_part_is_one_line_naming_the_download_before_any_heavy_import(tmp_path):
    """In a fresh interpreter with an empty cache: the line, and nothing heavy imported to say it."""
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0"}
    res = subprocess.run(
        [sys.executable, "-c", MISSING], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0, res.stderr[-3000:]
    line, imported = res.stdout.strip().splitlines()
    assert line == (
        "Wan-AI/Wan2.2-TI2V-5B-Diffusers: the Wan2.2 VAE is not in the Hugging Face cache (not cached), "
        "and runs never download it; download it once with network access: "
        "hf download Wan-AI/Wan2.2-TI2V-5B-Diffusers --include 'vae/*' (FastWAM reads it from that "
        "repository in the Hugging Face cache, as LeRobot does)"
    )
    assert imported == "[]"


def test_each_part_names_its_own_download_and_flag(tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    fake_cache(
        tmp_path,
        "Wan-AI/Wan2.2-TI2V-5B-Diffusers",
        {
            "vae/config.json": "{}",
            "vae/diffusion_pytorch_model.safetensors": "",
            "text_encoder/config.json": "{}",
        },
    )
    with pytest.raises(FrozenPartUnavailableError) as exc:
        resolve_frozen_sources()
    assert str(exc.value).startswith(
        "--policy.text_encoder_model_id=Wan-AI/Wan2.2-TI2V-5B-Diffusers: the UMT5 "
        "text encoder is not in the Hugging Face cache (the cached snapshot lacks "
    )
    assert "hf download Wan-AI/Wan2.2-TI2V-5B-Diffusers --include 'text_encoder/*'" in str(exc.value)
    with pytest.raises(FrozenPartUnavailableError) as exc:
        resolve_frozen_sources(text_encoder_model_id=None)
    assert (
        "--policy.tokenizer_model_id=google/umt5-xxl: the UMT5 tokenizer is not in the Hugging Face cache "
        "(not cached)"
    ) in str(exc.value)
    assert "hf download google/umt5-xxl --include '*.json' 'spiece.model' 'tokenizer/*'" in str(exc.value)
    assert "\n" not in str(exc.value)
