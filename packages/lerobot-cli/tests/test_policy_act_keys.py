"""State-dict keys equal LeRobot's, and a LeRobot-written checkpoint reproduces LeRobot's outputs here.

``data/act_small_keys.txt`` and ``data/lerobot_act_env/`` were written by LeRobot 0.6.1 itself
(``tools/interop/act_lerobot_interop.py lerobot-keys`` / ``lerobot-fixture``), so these tests check
compatibility without LeRobot installed.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from lerobot_cli.features import PolicyFeature
from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.policies.act.modeling import ACTPolicy
from lerobot_cli.policies.pretrained import load_pretrained
from lerobot_cli.processors import load_processors
from safetensors.torch import load_file

DATA = Path(__file__).parent / "data"


def _expected_keys() -> list[tuple[str, str]]:
    lines = (DATA / "act_small_keys.txt").read_text().splitlines()
    return [tuple(line.split(" ", 1)) for line in lines if line and not line.startswith("#")]


def test_state_dict_keys_and_shapes_equal_lerobot():
    cfg = ACTConfig(
        input_features={
            "observation.state": PolicyFeature("STATE", (4,)),
            "observation.environment_state": PolicyFeature("ENV", (3,)),
            "observation.images.top": PolicyFeature("VISUAL", (3, 32, 32)),
        },
        output_features={"action": PolicyFeature("ACTION", (2,))},
        chunk_size=5,
        n_action_steps=5,
        dim_model=32,
        n_heads=4,
        dim_feedforward=64,
        n_encoder_layers=2,
        n_decoder_layers=1,
        n_vae_encoder_layers=2,
        latent_dim=8,
        pretrained_backbone_weights=None,
    )
    ours = [(k, str(tuple(v.shape))) for k, v in ACTPolicy(cfg).state_dict().items()]
    expected = _expected_keys()
    assert len(expected) == 188
    assert sorted(ours) == sorted(expected)
    assert [k for k, _ in ours] == [k for k, _ in expected]  # same order too (LeRobot's module order)


def test_lerobot_checkpoint_reproduces_lerobot_outputs():
    src = DATA / "lerobot_act_env"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LeRobot's config.json has keys we do not model (use_peft, …)
        _, policy = load_pretrained(src)
    pre, post = load_processors(src)
    ref = load_file(str(src / "reference.safetensors"))
    inputs = {k[3:]: v for k, v in ref.items() if k.startswith("in.")}

    obs = {k: v for k, v in inputs.items() if k.startswith("observation.")}
    chunk = post(policy.predict_action_chunk(pre(obs)))
    torch.testing.assert_close(chunk, ref["out.chunk"], rtol=1e-4, atol=1e-5)

    policy.train()
    torch.manual_seed(1234)  # LeRobot drew its VAE sample after this same seed
    loss, info = policy(pre(dict(inputs)))
    assert abs(info["l1_loss"] - ref["out.l1"].item()) < 1e-5
    assert abs(info["kld_loss"] - ref["out.kld"].item()) < 1e-5
    assert abs(loss.item() - ref["out.loss"].item()) < 1e-4
