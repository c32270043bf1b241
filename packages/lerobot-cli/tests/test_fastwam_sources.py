"""What a FastWAM run reads from outside its dataset and checkpoints, through the policy contract's hooks.

``external_sources()``: the Wan2.2 VAE (always ``Wan-AI/Wan2.2-TI2V-5B-Diffusers``'s ``vae/``, as LeRobot
0.6.1), with ``load_text_encoder`` the UMT5 text encoder (``--policy.text_encoder_model_id``) and tokenizer
(``--policy.tokenizer_model_id``), and the base model a fresh full-size policy starts from
(``--policy.base_model_id``); ``variant=tiny`` builds its VAE and UMT5, so only the tokenizer. Each missing
one stops ``lerobot-train`` before any work in one line naming its flag and ``hf download`` (exit 2, said by
one process of a job). ``tokenizer()`` puts ``--policy.tokenizer_model_id`` under the custom-code refusal.
``initial_weights()``: the base's ``model.safetensors`` loaded over a fresh policy with LeRobot's
cross-embodiment rule, judged against the base's own ``config.json`` when it is a local directory.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.cli.checks import check_runnable
from lerobot_cli.cli.errors import UsageError
from lerobot_cli.errors import ConfigError
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies.fastwam.base import BaseModelUnavailable, resolve_base_model
from lerobot_cli.policies.fastwam.config import FastWAMConfig
from lerobot_cli.policies.fastwam.dit_configs import tiny_dit_configs

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
DEMO_TOKENIZER = REPO / "data" / "tokenizers" / "demo_bytes"
TRAIN = str(Path(sys.executable).parent / "lerobot-train")
WAN = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
CAMERA = "observation.images.top"
DEMO_DIMS = ("--policy.action_dim=2", "--policy.proprio_dim=2")  # the demo's action and observation.state


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache, offline."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def cache_repo(cache: Path, repo: str, files: dict[str, str]) -> Path:
    """``files`` of ``repo`` at revision main in the cache ``cache``."""
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / "0123abcd"
    for name, text in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_text(text)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text("0123abcd")
    return snapshot


def sources(config: FastWAMConfig) -> list[tuple[str, str]]:
    return [(s.flag, s.value) for s in config.external_sources()]


def test_what_each_setting_reads_and_from_where(tmp_path):
    full = [
        ("", WAN),  # the VAE: fixed, as LeRobot's load_pretrained_wan_vae
        ("--policy.text_encoder_model_id", WAN),
        ("--policy.tokenizer_model_id", "google/umt5-xxl"),
        ("--policy.base_model_id", "lerobot/fastwam_base"),
    ]
    assert sources(FastWAMConfig()) == full
    # text_encoder_model_id moves the text encoder alone: LeRobot reads the VAE from its fixed repository
    moved = sources(FastWAMConfig(text_encoder_model_id=str(tmp_path)))
    assert moved[:2] == [("", WAN), ("--policy.text_encoder_model_id", str(tmp_path))]
    # no UMT5 and no tokenizer without the text encoder (the batch carries the context)
    assert sources(FastWAMConfig(load_text_encoder=False)) == [full[0], full[3]]
    assert sources(FastWAMConfig(base_model_id=None)) == full[:3]
    assert sources(FastWAMConfig(pretrained_path="/a/policy")) == full[:3]  # its weights are the checkpoint's
    # tiny: VAE and UMT5 built from config, no base of its size; only the tokenizer it encodes prompts with
    assert sources(FastWAMConfig(variant="tiny")) == [full[2]]
    assert sources(FastWAMConfig(variant="tiny", load_text_encoder=False)) == []


def test_the_policy_and_the_check_resolve_the_same_parts(hub, tmp_path):
    from lerobot_cli.policies.fastwam.sources import resolve_config_parts

    vae = cache_repo(hub, WAN, {"vae/config.json": "{}", "vae/diffusion_pytorch_model.safetensors": ""})
    local = tmp_path / "umt5" / "text_encoder"
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}")
    (local / "model.safetensors").write_text("")
    config = FastWAMConfig(
        text_encoder_model_id=str(tmp_path / "umt5"), tokenizer_model_id=str(DEMO_TOKENIZER)
    )
    assert resolve_config_parts(config) == {
        "vae": vae / "vae",
        "text_encoder": local,
        "tokenizer": DEMO_TOKENIZER,
    }
    assert resolve_config_parts(FastWAMConfig(load_text_encoder=False)) == {"vae": vae / "vae"}
    assert resolve_config_parts(FastWAMConfig(variant="tiny", load_text_encoder=False)) == {}


def _check(*flags: str) -> None:
    base = [
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--policy.type=fastwam",
        *DEMO_DIMS,
    ]
    cfg = build_train_config(dict(f.removeprefix("--").split("=", 1) for f in (*base, *flags))).config
    check_runnable(cfg.finalized(), None)


def test_each_missing_source_is_one_line_naming_its_flag_and_download(hub):
    with pytest.raises(UsageError) as exc:
        _check()
    assert str(exc.value) == (
        f"{WAN}: the Wan2.2 VAE is not in the Hugging Face cache (not cached), and runs never download it; "
        f"download it once with network access: hf download {WAN} --include 'vae/*' (FastWAM reads it from "
        "that repository in the Hugging Face cache, as LeRobot does)"
    )
    cache_repo(hub, WAN, {"vae/config.json": "{}", "vae/diffusion_pytorch_model.safetensors": ""})
    with pytest.raises(UsageError) as exc:
        _check()
    assert str(exc.value).startswith(f"--policy.text_encoder_model_id={WAN}: the UMT5 text encoder is not in")
    assert f"hf download {WAN} --include 'text_encoder/*'" in str(exc.value)
    cache_repo(hub, WAN, {"text_encoder/config.json": "{}", "text_encoder/model.safetensors": ""})
    with pytest.raises(UsageError) as exc:
        _check()
    assert str(exc.value).startswith(
        "--policy.tokenizer_model_id=google/umt5-xxl: the UMT5 tokenizer is not in"
    )
    assert "hf download google/umt5-xxl --include '*.json' 'spiece.model' 'tokenizer/*'" in str(exc.value)
    with pytest.raises(UsageError) as exc:  # a local tokenizer: the base model is what is left
        _check(f"--policy.tokenizer_model_id={DEMO_TOKENIZER}")
    assert str(exc.value) == (
        "--policy.base_model_id=lerobot/fastwam_base is neither a local directory nor in the Hugging Face "
        f"cache ({hub}): download it once with network access (`hf download lerobot/fastwam_base`), or pass "
        "--policy.base_model_id=null to start from random weights"
    )
    _check(f"--policy.tokenizer_model_id={DEMO_TOKENIZER}", "--policy.base_model_id=null")
    for flags in (["--policy.load_text_encoder=false"], [f"--policy.text_encoder_model_id={hub / 'none'}"]):
        with pytest.raises(UsageError, match="base_model_id|text_encoder_model_id"):
            _check(*flags)  # no UMT5 needed: the base is next; a missing local directory is named
    absent = hub / "none"
    with pytest.raises(UsageError, match=rf"^--policy.text_encoder_model_id={absent}: no such directory"):
        _check(f"--policy.text_encoder_model_id={absent}")


NO_CONTEXTS = (
    "--policy.load_text_encoder=false: FastWAM then reads each sample's text context from the batch, but the "
    "dataset has no context/context_mask features; pass --policy.load_text_encoder=true to encode the task "
    "text with UMT5"
)


def test_a_tiny_fastwam_needs_no_source_but_its_tokenizer(hub):
    _check("--policy.variant=tiny", f"--policy.tokenizer_model_id={DEMO_TOKENIZER}")
    with pytest.raises(UsageError, match=r"^--policy.tokenizer_model_id=google/umt5-xxl: the UMT5 tokenizer"):
        _check("--policy.variant=tiny")
    with pytest.raises(ConfigError) as exc:  # no source at all: what is left is where the contexts come from
        _check("--policy.variant=tiny", "--policy.load_text_encoder=false")
    assert str(exc.value) == NO_CONTEXTS


def test_without_the_text_encoder_the_dataset_must_carry_the_contexts():
    """LeRobot fails at the first batch ("Prompt encoding requires loaded text encoder/tokenizer"); here the
    dataset is asked before any work: its context/context_mask, or the text encoder."""
    features = {
        CAMERA: {"dtype": "video", "shape": [64, 64, 3], "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": [3]},
        "action": {"dtype": "float32", "shape": [2]},
    }
    config = tiny_config(load_text_encoder=False)
    with pytest.raises(ConfigError) as exc:
        config.fit_dataset(features)
    assert str(exc.value) == NO_CONTEXTS
    contexts = {
        "context": {"dtype": "float32", "shape": [8, 32]},
        "context_mask": {"dtype": "bool", "shape": [8]},
    }
    assert config.fit_dataset({**features, **contexts}).input_features[CAMERA].shape == (3, 32, 64)
    tiny_config(load_text_encoder=True).fit_dataset(features)


def test_resume_and_dry_run_do_not_ask_for_the_base(hub):
    cache_repo(hub, WAN, {"vae/config.json": "{}", "vae/diffusion_pytorch_model.safetensors": ""})
    base = ["--dataset.repo_id=a/b", "--policy.type=fastwam", "--policy.load_text_encoder=false"]
    cfg = build_train_config(dict(f.removeprefix("--").split("=", 1) for f in base)).config.finalized()
    from lerobot_cli.cli.checks import check_external_sources

    with pytest.raises(UsageError, match="--policy.base_model_id"):
        check_external_sources(cfg)
    check_external_sources(attrs.evolve(cfg, resume=True))
    check_external_sources(attrs.evolve(cfg, dry_run=True))


def test_the_tokenizer_flag_is_under_the_custom_code_refusal(hub, tmp_path):
    directory = tmp_path / "tok"
    directory.mkdir()
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["custom_tok.CustomTokenizer", None]}})
    )
    (directory / "tokenizer.json").write_text("{}")
    (directory / "custom_tok.py").write_text("raise SystemExit('ran')\n")
    for variant in ("full", "tiny"):
        with pytest.raises(ConfigError) as exc:
            _check(f"--policy.variant={variant}", f"--policy.tokenizer_model_id={directory}")
        assert str(exc.value).startswith(
            f"--policy.tokenizer_model_id={directory}: its tokenizer_config.json has an auto_map that names "
            "custom Python code (custom_tok.py)"
        )
    # not loaded without the text encoder, so not refused (the contexts are what is missing then)
    with pytest.raises(ConfigError, match="^--policy.load_text_encoder=false: FastWAM then reads"):
        _check(
            "--policy.variant=tiny",
            "--policy.load_text_encoder=false",
            f"--policy.tokenizer_model_id={directory}",
        )


TORCH_FREE = (
    "import sys\n"
    "from lerobot_cli.cli.build import build_train_config\n"
    "from lerobot_cli.cli.checks import check_runnable\n"
    "from lerobot_cli.cli.errors import UsageError\n"
    "cfg = build_train_config({'dataset.repo_id': 'a/b', 'policy.type': 'fastwam'}).config.finalized()\n"
    "try:\n    check_runnable(cfg, None)\nexcept UsageError as exc:\n    print(str(exc).split(':')[0])\n"
    "print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))\n"
)


def test_the_check_imports_nothing_heavy(hub):
    res = subprocess.run(
        [sys.executable, "-c", TORCH_FREE],
        env={**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.splitlines() == [WAN, "[]"]


def _train(tmp_path: Path, hub: Path, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            TRAIN,
            "--dataset.repo_id=lerobot/demo_reach",
            f"--dataset.root={DEMO}",
            "--policy.type=fastwam",
            *DEMO_DIMS,
            f"--output_dir={tmp_path / 'run'}",
            "--steps=1",
            *flags,
        ],
        env={**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_lerobot_train_stops_in_one_line_once_per_job(tmp_path, hub):
    res = _train(tmp_path, hub, {}, f"--policy.tokenizer_model_id={DEMO_TOKENIZER}")
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.strip().splitlines() == [
        (
            f"lerobot-train: error: {WAN}: the Wan2.2 VAE is not in the Hugging Face cache (not cached), and "
            f"runs never download it; download it once with network access: hf download {WAN} --include "
            "'vae/*' (FastWAM reads it from that repository in the Hugging Face cache, as LeRobot does)"
        )
    ]
    assert not (tmp_path / "run").exists()  # before any work
    # under a launcher every process finds it; the first of the node says it, the others leave quietly
    quiet = _train(tmp_path, hub, {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    assert (quiet.returncode, quiet.stderr) == (2, "")


# -- the base model ---------------------------------------------------------------------------------------


def tiny_config(**overrides) -> FastWAMConfig:
    action_dim, state_dim = overrides.pop("action_dim", 2), overrides.pop("proprio_dim", 3)
    settings = {
        "variant": "tiny",
        "load_text_encoder": False,
        "torch_dtype": "float32",
        "action_dim": action_dim,
        "proprio_dim": state_dim,
        "num_video_frames": 5,
        "action_video_freq_ratio": 1,
        "action_horizon": 8,
        "n_action_steps": 8,
        "image_size": (32, 64),
        "input_features": {
            CAMERA: PolicyFeature(FeatureType.VISUAL, (3, 32, 64)),
            "observation.state": PolicyFeature(FeatureType.STATE, (state_dim,)),
        },
        "output_features": {"action": PolicyFeature(FeatureType.ACTION, (action_dim,))},
        **overrides,
    }
    return FastWAMConfig(**settings)


@pytest.fixture
def tiny_base(tmp_path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny FastWAM's pretrained_model/ (config.json with its tiny networks + model.safetensors)."""
    from lerobot_cli.policies.weights import build_policy, save_pretrained

    torch.manual_seed(1)
    policy = build_policy(tiny_config(base_model_id=None))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p))  # no tensor equal to a fresh one by construction
    directory = save_pretrained(policy, policy.config, tmp_path / "base")
    return directory, {k: v.clone() for k, v in policy.state_dict().items()}


def test_a_fresh_policy_starts_from_a_base_of_its_size_other_shapes_kept_fresh(tiny_base, caplog):
    """Another embodiment (action 4 wide, state 5): the action DiT's input and output layers and the proprio
    encoder keep their fresh values, named in one warning; everything else is the base's (LeRobot's
    _load_as_safetensor with strict=False). The tiny base is judged by its own config.json."""
    from lerobot_cli.policies.weights import build_policy

    directory, base = tiny_base
    config = tiny_config(base_model_id=str(directory), action_dim=4, proprio_dim=5)
    assert config.initial_weights().directory == directory
    torch.manual_seed(2)
    fresh = build_policy(attrs.evolve(config, base_model_id=None)).state_dict()
    torch.manual_seed(2)
    with caplog.at_level(logging.WARNING, logger="lerobot_cli.policies.weights"):
        started = build_policy(config).state_dict()
    other = sorted(k for k in started if k in base and started[k].shape != base[k].shape)
    assert other and all("action" in k or "proprio" in k for k in other), other
    assert all(torch.equal(started[k], fresh[k]) for k in other)
    assert all(torch.equal(started[k], base[k]) for k in started if k not in other)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{len(other)} tensors of other shapes (another action or state width) keep their fresh" in warning
    assert all(name in warning for name in other)
    note = config.initial_weights().note
    assert note.startswith(f"--policy.base_model_id={directory} ({directory / 'model.safetensors'}) over")


def test_a_base_of_other_sizes_is_not_loaded_and_the_banner_says_why(tiny_base):
    directory, _ = tiny_base
    video, action = tiny_dit_configs(2, num_layers=3)
    deeper = tiny_config(base_model_id=str(directory), video_dit_config=video, action_dit_config=action)
    assert deeper.initial_weights().directory is None and deeper.external_sources() == ()
    assert deeper.initial_weights().note == (
        f"as initialised: --policy.base_model_id={directory} is not loaded because "
        f"--policy.video_dit_config.num_layers is 3, not 2 as in the base's own {directory / 'config.json'} "
        "(LeRobot loads a base only into networks of its size)"
    )
    # LeRobot's rule for a Hub id: its full-size networks, so a tiny config never needs lerobot/fastwam_base
    hub_default = tiny_config()
    assert hub_default.external_sources() == () and hub_default.initial_weights().directory is None
    assert "--policy.video_dit_config.hidden_dim is 32, not 3072 as in the base's full-size networks" in (
        hub_default.initial_weights().note
    )
    assert FastWAMConfig(base_model_id=str(directory)).initial_weights().directory is None  # full vs tiny


def test_a_dry_run_builds_a_full_size_fastwam_without_its_base(hub):
    """On the meta device nothing is read: the base (absent here) is not even looked for."""
    from lerobot_cli.policies.weights import build_policy

    config = FastWAMConfig(load_text_encoder=False)
    with pytest.raises(BaseModelUnavailable):
        config.initial_weights()
    with torch.device("meta"):
        policy = build_policy(config)
    assert sum(p.numel() for p in policy.parameters()) == 6_020_710_599


def test_a_base_directory_must_hold_weights_and_a_full_size_one_without_config_is_lerobots(tmp_path, hub):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BaseModelUnavailable, match=rf"^--policy.base_model_id={empty}: no model.safetensors"):
        resolve_base_model(FastWAMConfig(base_model_id=str(empty)))
    (empty / "model.safetensors").write_text("")
    assert resolve_base_model(FastWAMConfig(base_model_id=str(empty))) == empty  # judged by LeRobot's sizes
    assert resolve_base_model(tiny_config(base_model_id=str(empty))) is None
    snapshot = cache_repo(hub, "lerobot/fastwam_base", {"config.json": "{}"})  # partly cached: no weights
    with pytest.raises(BaseModelUnavailable, match="is neither a local directory nor in the Hugging Face"):
        resolve_base_model(FastWAMConfig())
    (snapshot / "model.safetensors").write_text("")
    assert resolve_base_model(FastWAMConfig()) == snapshot
