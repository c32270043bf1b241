"""The mixture of transformers: video block i and action block i attend together, layer by layer.

``MoTLayer`` owns both experts' block i (``layers.<i>.blocks.{video,action}``): FastWAM's FSDP wrap unit.
FSDP gathers a unit's parameters in a hook on its ``forward``, and no block's ``forward`` ever runs (the joint
attention concatenates both experts' queries, keys and values), so every use of a layer goes through
``MoTLayer.forward`` with a ``mode``:

* ``"joint"`` (training, and joint inference): both experts' q/k/v are concatenated along the sequence and
  attended once under the mixture mask, then each expert finishes its block on its own slice.
* ``"video_prefill"`` (action inference): the video expert alone under its video-to-video mask; the layer
  also returns the rotated keys and the values, the cache the action steps read.
* ``"action_cached"`` (action inference): action queries attend to the cached video keys/values followed by
  the action's own, under the action rows of the mixture mask.

With ``first_frame_causal`` video masks the first frame's tokens attend only to themselves, and the action
rows see only that frame and the actions, so prefilling the first frame once and then running the cached
action path gives the action tokens a joint forward over the full video would give (up to the summation
order of attention over differently sized key sets).

Each parameter has one owner: the blocks are registered in the layers only; ``mixtures`` holds each expert's
embeddings and head. Checkpoints from before LeRobot moved the blocks into the layers
(``mixtures.<expert>.blocks.<i>.*``) are renamed on load, as LeRobot's ``MoT`` does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from lerobot_cli.policies.fastwam.action_dit import ActionDiT
from lerobot_cli.policies.fastwam.attention import masked_attention
from lerobot_cli.policies.fastwam.blocks import Carry, DiTBlock, rope_for
from lerobot_cli.policies.fastwam.stream import ExpertInput
from lerobot_cli.policies.fastwam.video_dit import VideoDiT

EXPERTS = ("video", "action")
_LEGACY_BLOCK = re.compile(r"mixtures\.([^.]+)\.blocks\.(\d+)\.(.+)$")


class MoTLayer(nn.Module):
    """Layer i of the mixture: ``blocks["video"]`` and ``blocks["action"]`` (see the module docstring)."""

    def __init__(
        self, blocks: dict[str, DiTBlock], num_heads: int, fp32_attention: bool, checkpoint_attention: bool
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict(blocks)
        self.num_heads = num_heads
        self.fp32_attention = fp32_attention
        self.checkpoint_attention = checkpoint_attention  # LeRobot's mot_checkpoint_mixed_attn

    def forward(self, mode: str, **inputs):
        """``joint(streams, mask)``, ``video_prefill(stream, mask)`` or ``action_cached(stream, k_video,
        v_video, mask)`` — the one entry FSDP hooks, whichever path runs."""
        if mode == "joint":
            return self._joint(**inputs)
        if mode == "video_prefill":
            return self._video_prefill(**inputs)
        if mode == "action_cached":
            return self._action_cached(**inputs)
        raise ValueError(f"unknown MoTLayer mode {mode!r} (joint, video_prefill, action_cached)")

    def _open(self, name: str, stream: ExpertInput) -> tuple[Tensor, Tensor, Tensor, Carry]:
        rope = rope_for(stream.phasors, self.num_heads, stream.rope_dtype)
        return self.blocks[name].open(stream.tokens, stream.t_mod, rope)

    def _close(self, name: str, stream: ExpertInput, carry: Carry, attended: Tensor) -> Tensor:
        block = self.blocks[name]
        return block.close(carry, attended, stream.context, stream.context_mask, self.fp32_attention)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        mask = mask.to(device=q.device)

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return masked_attention(q, k, v, self.num_heads, mask, self.fp32_attention)

        if self.checkpoint_attention and self.training:
            return torch.utils.checkpoint.checkpoint(attend, q, k, v, use_reentrant=False)
        return attend(q, k, v)

    def _joint(self, streams: dict[str, ExpertInput], mask: Tensor) -> dict[str, Tensor]:
        names = [name for name in self.blocks if name in streams]
        opened = {name: self._open(name, streams[name]) for name in names}
        q = torch.cat([opened[name][0] for name in names], dim=1)
        k = torch.cat([opened[name][1] for name in names], dim=1)
        v = torch.cat([opened[name][2] for name in names], dim=1)
        if mask.shape[0] != q.shape[1]:
            raise ValueError(
                f"the mixture mask covers {mask.shape[0]} tokens, the experts bring {q.shape[1]}"
            )
        attended = self._attend(q, k, v, mask)
        out, start = {}, 0
        for name in names:
            end = start + streams[name].tokens.shape[1]
            out[name] = self._close(name, streams[name], opened[name][3], attended[:, start:end, :])
            start = end
        return out

    def _video_prefill(self, stream: ExpertInput, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v, carry = self._open("video", stream)
        return self._close("video", stream, carry, self._attend(q, k, v, mask)), k, v

    def _action_cached(self, stream: ExpertInput, k_video: Tensor, v_video: Tensor, mask: Tensor) -> Tensor:
        q, k, v, carry = self._open("action", stream)
        attended = self._attend(q, torch.cat([k_video, k], dim=1), torch.cat([v_video, v], dim=1), mask)
        return self._close("action", stream, carry, attended)


class MoT(nn.Module):
    """Both experts (``mixtures``: embeddings and heads) and the ``layers`` that own their blocks."""

    def __init__(self, video: VideoDiT, action: ActionDiT, checkpoint_attention: bool = False) -> None:
        super().__init__()
        for key in ("num_layers", "num_heads", "head_dim", "fp32_attention"):
            if getattr(video, key) != getattr(action, key):
                raise ValueError(
                    f"the video and action DiTs must share {key}: {getattr(video, key)} vs "
                    f"{getattr(action, key)}"
                )
        self.mixtures = nn.ModuleDict({"video": video, "action": action})
        self.num_layers, self.num_heads = video.num_layers, video.num_heads
        self.fp32_attention = video.fp32_attention
        self.layers = nn.ModuleList(
            MoTLayer({"video": v, "action": a}, self.num_heads, self.fp32_attention, checkpoint_attention)
            for v, a in zip(video.make_blocks(), action.make_blocks(), strict=True)
        )

    def forward(self, streams: dict[str, ExpertInput], mask: Tensor) -> dict[str, Tensor]:
        """Joint pass: every layer over both experts' tokens; returns each expert's last tokens."""
        missing = [name for name in EXPERTS if name not in streams]
        if missing:
            raise ValueError(f"the mixture needs both experts' inputs; missing {missing}")
        _check_square(mask, "mixture mask")
        streams = dict(streams)
        for layer in self.layers:
            tokens = layer("joint", streams=streams, mask=mask)
            streams = {name: streams[name].with_tokens(tokens[name]) for name in streams}
        return {name: stream.tokens for name, stream in streams.items()}

    def prefill_video(self, stream: ExpertInput, mask: Tensor) -> list[tuple[Tensor, Tensor]]:
        """The video expert alone under ``mask`` (``(S_v, S_v)``); each layer's rotated keys and values."""
        _check_square(mask, "video mask")
        if mask.shape[0] != stream.tokens.shape[1]:
            raise ValueError(
                f"the video mask covers {mask.shape[0]} tokens, the video brings {stream.tokens.shape[1]}"
            )
        cache = []
        for layer in self.layers:
            tokens, k, v = layer("video_prefill", stream=stream, mask=mask)
            stream = stream.with_tokens(tokens)
            cache.append((k, v))
        return cache

    def action_with_cache(
        self, stream: ExpertInput, cache: Sequence[tuple[Tensor, Tensor]], mask: Tensor
    ) -> Tensor:
        """The action expert against cached video keys/values; ``mask`` is the joint ``(S_v + S_a)²`` mask
        (its action rows are used). Returns the action expert's last tokens."""
        _check_square(mask, "mixture mask")
        if len(cache) != self.num_layers:
            raise ValueError(f"the video cache has {len(cache)} layers, the mixture {self.num_layers}")
        video_len = cache[0][0].shape[1]
        total = video_len + stream.tokens.shape[1]
        if mask.shape[0] != total:
            raise ValueError(
                f"the mixture mask covers {mask.shape[0]} tokens, cache and actions bring {total}"
            )
        rows = mask[video_len:total, :total]
        for layer, (k_video, v_video) in zip(self.layers, cache, strict=True):
            tokens = layer("action_cached", stream=stream, k_video=k_video, v_video=v_video, mask=rows)
            stream = stream.with_tokens(tokens)
        return stream.tokens

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Rename the legacy block layout ``{prefix}mixtures.<expert>.blocks.<i>.*`` to
        ``{prefix}layers.<i>.blocks.<expert>.*`` in place, before the children read their keys (LeRobot's
        ``MoT`` does the same)."""
        renamed = {}
        for key in [k for k in state_dict if k.startswith(prefix)]:
            match = _LEGACY_BLOCK.match(key[len(prefix) :])
            if match is not None:
                expert, index, rest = match.groups()
                renamed[f"{prefix}layers.{index}.blocks.{expert}.{rest}"] = state_dict.pop(key)
        state_dict.update(renamed)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _check_square(mask: Tensor, what: str) -> None:
    if mask.ndim != 2 or mask.shape[0] != mask.shape[1]:
        raise ValueError(f"the {what} must be a square (S, S) matrix, got {tuple(mask.shape)}")
