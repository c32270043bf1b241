"""The ACT network: (VAE encoder →) latent, transformer encoder over state/env/camera tokens, decoder.

Training with ``use_vae``: a BERT-like VAE encoder reads ``[cls, robot_state?, *action_chunk]`` and its
cls output parameterises a Gaussian "style" latent; the transformer then acts as the VAE decoder. At
inference (or without the VAE) the latent is zero. Encoder tokens are
``[latent, robot_state?, env_state?, *camera feature-map pixels]``; the decoder turns ``chunk_size``
learned queries into the action chunk. Attribute names are LeRobot's, so ``state_dict`` keys match.
"""

from __future__ import annotations

from itertools import chain

import torch
from torch import Tensor, nn

from lerobot_cli.policies.act.backbone import ResNetFeatureMap, load_backbone_weights
from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.policies.act.embeddings import ACTSinusoidalPositionEmbedding2d, sinusoidal_embedding_1d
from lerobot_cli.policies.act.transformer import ACTDecoder, ACTEncoder

OBS_STATE = "observation.state"
OBS_ENV_STATE = "observation.environment_state"
OBS_IMAGES = "observation.images"
ACTION = "action"
ACTION_IS_PAD = "action_is_pad"


class ACT(nn.Module):
    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.config = config
        has_state = config.robot_state_feature is not None
        has_env = config.env_state_feature is not None
        action_dim = config.action_feature.shape[0]
        d = config.dim_model

        if config.use_vae:
            self.vae_encoder = ACTEncoder(config, is_vae_encoder=True)
            self.vae_encoder_cls_embed = nn.Embedding(1, d)
            if has_state:
                self.vae_encoder_robot_state_input_proj = nn.Linear(config.robot_state_feature.shape[0], d)
            self.vae_encoder_action_input_proj = nn.Linear(action_dim, d)
            self.vae_encoder_latent_output_proj = nn.Linear(d, 2 * config.latent_dim)  # [mu, 2·log σ]
            n_vae_tokens = 1 + int(has_state) + config.chunk_size
            # Persistent, as in LeRobot: it is part of the checkpoint's key set.
            self.register_buffer("vae_encoder_pos_enc", sinusoidal_embedding_1d(n_vae_tokens, d).unsqueeze(0))

        if config.image_features:
            self.backbone = ResNetFeatureMap(
                config.vision_backbone, config.replace_final_stride_with_dilation
            )
            if config.pretrained_backbone_weights:
                load_backbone_weights(self.backbone, config.pretrained_backbone_weights)

        self.encoder = ACTEncoder(config)
        self.decoder = ACTDecoder(config)

        if has_state:
            self.encoder_robot_state_input_proj = nn.Linear(config.robot_state_feature.shape[0], d)
        if has_env:
            self.encoder_env_state_input_proj = nn.Linear(config.env_state_feature.shape[0], d)
        self.encoder_latent_input_proj = nn.Linear(config.latent_dim, d)
        if config.image_features:
            self.encoder_img_feat_input_proj = nn.Conv2d(self.backbone.out_channels, d, kernel_size=1)
        self.encoder_1d_feature_pos_embed = nn.Embedding(1 + int(has_state) + int(has_env), d)
        if config.image_features:
            self.encoder_cam_feat_pos_embed = ACTSinusoidalPositionEmbedding2d(d // 2)

        self.decoder_pos_embed = nn.Embedding(config.chunk_size, d)  # DETR-style learned queries
        self.action_head = nn.Linear(d, action_dim)

        for p in chain(self.encoder.parameters(), self.decoder.parameters()):
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    @staticmethod
    def _batch_size(batch: dict) -> int:
        if OBS_IMAGES in batch:
            return batch[OBS_IMAGES][0].shape[0]
        return batch[OBS_ENV_STATE].shape[0]

    def _encode_latent(self, batch: dict, batch_size: int) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Sample the style latent from the VAE encoder, or return zeros when it is not used."""
        if not (self.config.use_vae and self.training and ACTION in batch):
            weight = self.encoder_latent_input_proj.weight
            zeros = torch.zeros(batch_size, self.config.latent_dim, dtype=weight.dtype, device=weight.device)
            return zeros, None, None
        actions = batch[ACTION]
        tokens = [self.vae_encoder_cls_embed.weight.expand(batch_size, 1, -1)]
        if self.config.robot_state_feature is not None:
            tokens.append(self.vae_encoder_robot_state_input_proj(batch[OBS_STATE]).unsqueeze(1))
        tokens.append(self.vae_encoder_action_input_proj(actions))
        tokens = torch.cat(tokens, dim=1).transpose(0, 1)  # (S, B, D)
        n_prefix = tokens.shape[0] - actions.shape[1]
        action_pad = batch.get(ACTION_IS_PAD)
        if action_pad is None:
            action_pad = torch.zeros(actions.shape[:2], dtype=torch.bool, device=actions.device)
        prefix_pad = torch.zeros(batch_size, n_prefix, dtype=torch.bool, device=actions.device)
        key_padding_mask = torch.cat([prefix_pad, action_pad.to(torch.bool)], dim=1)
        cls_out = self.vae_encoder(
            tokens, pos_embed=self.vae_encoder_pos_enc.transpose(0, 1), key_padding_mask=key_padding_mask
        )[0]
        params = self.vae_encoder_latent_output_proj(cls_out)
        mu, log_sigma_x2 = params[:, : self.config.latent_dim], params[:, self.config.latent_dim :]
        latent = mu + (0.5 * log_sigma_x2).exp() * torch.randn_like(mu)  # reparameterisation trick
        return latent, mu, log_sigma_x2

    def _camera_tokens(self, images: list[Tensor]) -> tuple[Tensor, Tensor]:
        """Backbone features of every camera as (H·W·n_cams, B, D) tokens and their position embeddings."""
        if len(images) > 1 and len({tuple(img.shape) for img in images}) == 1:
            # Cameras of one shape go through the backbone as one batch (frozen BN: no cross-sample effect).
            per_camera = self.backbone(torch.cat(images)).chunk(len(images))
        else:
            per_camera = [self.backbone(img) for img in images]
        tokens, pos = [], []
        for features in per_camera:
            cam_pos = self.encoder_cam_feat_pos_embed(features).to(dtype=features.dtype)
            features = self.encoder_img_feat_input_proj(features)
            tokens.append(features.flatten(2).permute(2, 0, 1))  # (H·W, B, D)
            pos.append(cam_pos.flatten(2).permute(2, 0, 1))  # (H·W, 1, D)
        return torch.cat(tokens), torch.cat(pos)

    def forward(self, batch: dict) -> tuple[Tensor, tuple[Tensor | None, Tensor | None]]:
        """``batch``: state ``(B, S)``, env ``(B, E)``, ``observation.images`` a list of ``(B, C, H, W)``,
        in training also ``action (B, chunk, A)`` and ``action_is_pad (B, chunk)``.
        Returns ``(B, chunk, A)`` actions and the latent's ``(mu, 2·log σ)`` (None without the VAE).
        """
        if self.config.use_vae and self.training and ACTION not in batch:
            raise ValueError("ACT with use_vae needs 'action' in the batch in training mode")
        batch_size = self._batch_size(batch)
        latent, mu, log_sigma_x2 = self._encode_latent(batch, batch_size)

        tokens = [self.encoder_latent_input_proj(latent)]
        if self.config.robot_state_feature is not None:
            tokens.append(self.encoder_robot_state_input_proj(batch[OBS_STATE]))
        if self.config.env_state_feature is not None:
            tokens.append(self.encoder_env_state_input_proj(batch[OBS_ENV_STATE]))
        tokens = torch.stack(tokens)  # (n_1d, B, D)
        pos = self.encoder_1d_feature_pos_embed.weight.unsqueeze(1)  # (n_1d, 1, D)
        if self.config.image_features:
            cam_tokens, cam_pos = self._camera_tokens(batch[OBS_IMAGES])
            tokens = torch.cat([tokens, cam_tokens.to(tokens.dtype)])
            pos = torch.cat([pos, cam_pos.to(pos.dtype)])

        encoder_out = self.encoder(tokens, pos_embed=pos)
        queries = self.decoder_pos_embed.weight.unsqueeze(1)  # (chunk, 1, D)
        decoder_in = torch.zeros(
            (self.config.chunk_size, batch_size, self.config.dim_model), dtype=pos.dtype, device=pos.device
        )
        decoder_out = self.decoder(decoder_in, encoder_out, decoder_pos_embed=queries, encoder_pos_embed=pos)
        return self.action_head(decoder_out.transpose(0, 1)), (mu, log_sigma_x2)
