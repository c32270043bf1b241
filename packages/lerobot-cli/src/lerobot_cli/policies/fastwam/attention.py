"""FastWAM's attention: one masked SDPA call, and the boolean masks that route video and action tokens.

Masks are ``True`` where a query may attend to a key (``scaled_dot_product_attention``'s boolean
convention). Every row keeps at least one key, so no softmax row is empty.

* Video to video (``video_attention_mask_mode``): ``bidirectional`` (all), ``per_frame_causal`` (a token sees
  its own and earlier latent frames) or ``first_frame_causal`` (FastWAM's: the first frame, the clean
  conditioning image, sees only itself; later frames see everything). With ``first_frame_causal`` the first
  frame's keys and values never depend on the rest, which is what lets inference compute them once.
* The mixture (``mot_attention_mask``): video rows as above and blind to actions; action rows see every
  action token and the first video frame only.
* Action groups (``group_causal_mask``, video DiTs conditioned on actions): latent frame ``g + 1`` attends to
  the actions of transition ``g`` (``group_diagonal``) or of every transition up to ``g`` (``causal``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def masked_attention(
    q: Tensor, k: Tensor, v: Tensor, num_heads: int, mask: Tensor | None, fp32: bool
) -> Tensor:
    """SDPA over ``(B, S, heads·d)`` inputs, returned as ``(B, S_q, heads·d)``.

    ``fp32``: q, k and v in float32 (the output is float32); otherwise q and k take v's dtype."""

    def heads_first(x: Tensor) -> Tensor:
        b, s = x.shape[:2]
        return x.reshape(b, s, num_heads, -1).permute(0, 2, 1, 3)

    q, k, v = heads_first(q), heads_first(k), heads_first(v)
    if fp32:
        q, k, v = q.float(), k.float(), v.float()
    else:
        q, k = q.to(v.dtype), k.to(v.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    b, _, s, _ = out.shape
    return out.permute(0, 2, 1, 3).reshape(b, s, -1)


def video_self_mask(mode: str, seq_len: int, tokens_per_frame: int, device: torch.device | str) -> Tensor:
    """``(S, S)`` video-to-video mask of ``mode`` (see the module docstring)."""
    if seq_len <= 0 or tokens_per_frame <= 0:
        raise ValueError(
            f"video mask needs positive lengths, got seq_len={seq_len}, tokens_per_frame={tokens_per_frame}"
        )
    if mode == "bidirectional":
        return torch.ones((seq_len, seq_len), dtype=torch.bool, device=device)
    if mode == "per_frame_causal":
        if seq_len % tokens_per_frame:
            raise ValueError(
                f"per_frame_causal: {seq_len} video tokens are not whole frames of {tokens_per_frame}"
            )
        frames = seq_len // tokens_per_frame
        causal = torch.tril(torch.ones((frames, frames), dtype=torch.bool, device=device))
        return causal.repeat_interleave(tokens_per_frame, dim=0).repeat_interleave(tokens_per_frame, dim=1)
    if mode == "first_frame_causal":
        mask = torch.ones((seq_len, seq_len), dtype=torch.bool, device=device)
        first = min(tokens_per_frame, seq_len)
        mask[:first, first:] = False
        return mask
    raise ValueError(f"unknown video attention mask mode {mode!r}")


def mot_attention_mask(video_mask: Tensor, action_len: int, tokens_per_frame: int) -> Tensor:
    """``(S_v + S_a)²`` joint mask from the video-to-video one: actions see all actions and the first
    frame."""
    video_len = video_mask.shape[0]
    total = video_len + action_len
    mask = torch.zeros((total, total), dtype=torch.bool, device=video_mask.device)
    mask[:video_len, :video_len] = video_mask
    mask[video_len:, video_len:] = True
    mask[video_len:, : min(tokens_per_frame, video_len)] = True
    return mask


def group_causal_mask(groups: int, queries_per_group: int, keys_per_group: int, mode: str) -> Tensor:
    """``(groups·queries_per_group, groups·keys_per_group)``: query group i sees key group i
    (``group_diagonal``) or key groups ≤ i (``causal``)."""
    if mode not in ("causal", "group_diagonal"):
        raise ValueError(f"group mask mode must be causal or group_diagonal, got {mode!r}")
    if min(groups, queries_per_group, keys_per_group) <= 0:
        raise ValueError(
            f"group mask sizes must be positive, got {groups}, {queries_per_group}, {keys_per_group}"
        )
    query_group = torch.arange(groups).repeat_interleave(queries_per_group).unsqueeze(1)
    key_group = torch.arange(groups).repeat_interleave(keys_per_group).unsqueeze(0)
    return query_group >= key_group if mode == "causal" else query_group == key_group
