"""FastWAM's two network configs, ``video_dit_config`` and ``action_dit_config``: the sizes and their checks.

They are plain dicts of LeRobot 0.6.1's keyword arguments (``WanVideoDiT``'s and the action DiT's), so a
``config.json`` carries them as LeRobot writes and reads them. Here are LeRobot's defaults (the
Wan2.2-TI2V-5B video DiT and the 1 B action DiT, the size of ``lerobot/fastwam_base``), the tiny sizes, and
the checks ``FastWAMConfig`` runs on both dicts once it has filled them in (``config.py``): missing or
unknown keys, the keys LeRobot accepts at one value only, and the sizes that Wan's attention, the rotary
embeddings and the mixture of transformers need to pair up, each refused in one line naming its flag before
any weight is built.
Torch-free, as ``config.py`` is.

:func:`tiny_dit_configs` gives network sizes for tests and CPU demos (a model built in milliseconds); LeRobot
builds the same tiny model from the same ``config.json``.
"""

from __future__ import annotations

from typing import Any

VIDEO_MASK_MODES = ("bidirectional", "per_frame_causal", "first_frame_causal")
GROUP_MASK_MODES = ("causal", "group_diagonal")

# The video DiT's keyword arguments in LeRobot (WanVideoDiT); the first group has no default there.
VIDEO_REQUIRED_KEYS = (
    "hidden_dim",
    "in_dim",
    "ffn_dim",
    "out_dim",
    "text_dim",
    "freq_dim",
    "eps",
    "patch_size",
    "num_heads",
    "attn_head_dim",
    "num_layers",
)
# Keys LeRobot accepts only at these values (it refuses the others when it builds the video DiT).
VIDEO_FIXED_KEYS = {
    "has_image_input": False,
    "has_image_pos_emb": False,
    "has_ref_conv": False,
    "add_control_adapter": False,
    "require_vae_embedding": False,
    "require_clip_embedding": False,
    "fuse_vae_embedding_in_latents": True,
}
VIDEO_OPTIONAL_DEFAULTS = {
    "in_dim_control_adapter": 24,
    "seperated_timestep": False,
    "action_conditioned": False,
    "action_dim": 7,
    "action_group_causal_mask_mode": "causal",
    "video_attention_mask_mode": "bidirectional",
    "use_gradient_checkpointing": False,
    "fp32_attention": True,
}
ACTION_REQUIRED_KEYS = (
    "hidden_dim",
    "action_dim",
    "ffn_dim",
    "text_dim",
    "freq_dim",
    "eps",
    "num_heads",
    "attn_head_dim",
    "num_layers",
)
ACTION_OPTIONAL_DEFAULTS = {"use_gradient_checkpointing": False, "fp32_attention": True}


def default_video_dit_config(action_dim: int) -> dict[str, Any]:
    """The Wan2.2-TI2V-5B video DiT as FastWAM configures it (LeRobot's default ``video_dit_config``)."""
    return {
        "patch_size": [1, 2, 2],
        "in_dim": 48,
        "hidden_dim": 3072,
        "ffn_dim": 14336,
        "freq_dim": 256,
        "text_dim": 4096,
        "out_dim": 48,
        "num_heads": 24,
        "attn_head_dim": 128,
        "num_layers": 30,
        "eps": 1.0e-6,
        "seperated_timestep": True,
        "use_gradient_checkpointing": False,
        "video_attention_mask_mode": "first_frame_causal",
        "action_conditioned": False,
        "action_dim": action_dim,
        "action_group_causal_mask_mode": "group_diagonal",
        "fp32_attention": True,
    }


def default_action_dit_config(action_dim: int) -> dict[str, Any]:
    """The 1 B action DiT (LeRobot's default ``action_dit_config``): 30 layers in the video DiT's heads."""
    return {
        "action_dim": action_dim,
        "hidden_dim": 1024,
        "ffn_dim": 4096,
        "num_heads": 24,
        "attn_head_dim": 128,
        "num_layers": 30,
        "text_dim": 4096,
        "freq_dim": 256,
        "eps": 1.0e-6,
        "use_gradient_checkpointing": False,
        "fp32_attention": True,
    }


def tiny_dit_configs(
    action_dim: int = 7, *, latent_channels: int = 48, text_dim: int = 32, num_layers: int = 2
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(video_dit_config, action_dit_config)`` of a FastWAM small enough to build and run in milliseconds.

    The structure is the full model's (two heads of 16, three RoPE axes in the video DiT, an action DiT whose
    attention width 32 differs from its hidden width 24 as the full one's 3072 differs from 1024);
    ``latent_channels`` must be the VAE's ``z_dim`` and ``text_dim`` the text encoder's width.
    """
    video = default_video_dit_config(action_dim)
    video.update(
        in_dim=latent_channels,
        out_dim=latent_channels,
        hidden_dim=32,
        ffn_dim=64,
        freq_dim=16,
        text_dim=text_dim,
        num_heads=2,
        attn_head_dim=16,
        num_layers=num_layers,
    )
    action = default_action_dit_config(action_dim)
    action.update(
        hidden_dim=24,
        ffn_dim=48,
        num_heads=2,
        attn_head_dim=16,
        num_layers=num_layers,
        text_dim=text_dim,
        freq_dim=16,
    )
    return video, action


def require_positive_int(name: str, value: Any) -> None:
    """The rule of every size and count, the networks' and ``FastWAMConfig``'s: an int (not a bool) ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--policy.{name} must be an integer ≥ 1, got {value!r}")


def _check_keys(
    flag: str, config: dict[str, Any], required: tuple[str, ...], optional: dict[str, Any]
) -> None:
    missing = [k for k in required if k not in config]
    if missing:
        raise ValueError(f"--policy.{flag} lacks {', '.join(missing)} (see default_{flag}() for a full one)")
    unknown = sorted(set(config) - set(required) - set(optional))
    if unknown:
        raise ValueError(
            f"--policy.{flag} has unknown keys {', '.join(unknown)} (known: "
            f"{', '.join(sorted({*required, *optional}))})"
        )


def check_video_dit(video: dict[str, Any]) -> None:
    """The filled-in ``video_dit_config``, as LeRobot's ``WanVideoDiT`` would take it and FastWAM run it."""
    _check_keys(
        "video_dit_config", video, VIDEO_REQUIRED_KEYS, {**VIDEO_FIXED_KEYS, **VIDEO_OPTIONAL_DEFAULTS}
    )
    for key, value in VIDEO_FIXED_KEYS.items():
        if key in video and bool(video[key]) != value:
            raise ValueError(
                f"--policy.video_dit_config: {key}={video[key]!r} is not supported by FastWAM "
                f"(only {str(value).lower()})"
            )
    if not video.get("seperated_timestep", False):
        raise ValueError(
            "--policy.video_dit_config: seperated_timestep must be true (FastWAM gives the "
            "clean first latent frame timestep 0 and the others the sampled one)"
        )
    for key in (
        "hidden_dim",
        "in_dim",
        "ffn_dim",
        "out_dim",
        "text_dim",
        "freq_dim",
        "num_heads",
        "attn_head_dim",
        "num_layers",
    ):
        require_positive_int(f"video_dit_config.{key}", video[key])
    patch = video["patch_size"]
    if (
        not isinstance(patch, (list, tuple))
        or len(patch) != 3
        or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 1 for p in patch)
    ):
        raise ValueError(f"--policy.video_dit_config.patch_size must be three integers ≥ 1, got {patch!r}")
    if video["attn_head_dim"] * video["num_heads"] != video["hidden_dim"]:
        raise ValueError(
            f"--policy.video_dit_config: attn_head_dim ({video['attn_head_dim']}) × num_heads "
            f"({video['num_heads']}) must equal hidden_dim ({video['hidden_dim']}) (Wan's "
            "attention)"
        )
    if video["attn_head_dim"] % 2 or video["freq_dim"] % 2:
        raise ValueError(
            "--policy.video_dit_config: attn_head_dim and freq_dim must be even (rotary and "
            "sinusoidal embeddings pair channels)"
        )
    for key, choices in (
        ("video_attention_mask_mode", VIDEO_MASK_MODES),
        ("action_group_causal_mask_mode", GROUP_MASK_MODES),
    ):
        value = video.get(key, VIDEO_OPTIONAL_DEFAULTS[key])
        if value not in choices:
            raise ValueError(
                f"--policy.video_dit_config.{key}: invalid choice {value!r} (choose from "
                f"{', '.join(choices)})"
            )


def check_action_dit(action: dict[str, Any], video: dict[str, Any], action_dim: int) -> None:
    """The filled-in ``action_dit_config``, against ``--policy.action_dim`` and the video DiT it is layered
    with."""
    _check_keys("action_dit_config", action, ACTION_REQUIRED_KEYS, ACTION_OPTIONAL_DEFAULTS)
    for key in ("hidden_dim", "ffn_dim", "text_dim", "freq_dim", "num_heads", "attn_head_dim", "num_layers"):
        require_positive_int(f"action_dit_config.{key}", action[key])
    if action["attn_head_dim"] % 2 or action["freq_dim"] % 2:
        raise ValueError(
            "--policy.action_dit_config: attn_head_dim and freq_dim must be even (rotary and "
            "sinusoidal embeddings pair channels)"
        )
    if action["action_dim"] != action_dim:
        raise ValueError(
            f"--policy.action_dit_config.action_dim ({action['action_dim']}) must equal "
            f"--policy.action_dim ({action_dim})"
        )
    for key in ("num_heads", "attn_head_dim", "num_layers"):
        if action[key] != video[key]:
            raise ValueError(
                f"--policy.action_dit_config.{key} ({action[key]}) must equal "
                f"video_dit_config.{key} ({video[key]}): the mixture of transformers attends "
                "over both experts' tokens layer by layer"
            )
    if action["text_dim"] != video["text_dim"]:
        raise ValueError(
            f"--policy.action_dit_config.text_dim ({action['text_dim']}) must equal "
            f"video_dit_config.text_dim ({video['text_dim']}): both experts read the same text "
            "context"
        )
