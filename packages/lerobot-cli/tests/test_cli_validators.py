"""Every validator of the CLI-owned config sections rejects bad values with a message naming the flag."""

import pytest
from lerobot_cli.config import TrainConfig
from lerobot_cli.datasets.config import DatasetConfig
from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig
from lerobot_cli.peft.config import PeftConfig
from lerobot_cli.policies import config_class


@pytest.mark.parametrize(
    ("build", "flag"),
    [
        (lambda: DatasetConfig(episodes=[0, 0]), "--dataset.episodes"),
        (lambda: DatasetConfig(episodes=[-1]), "--dataset.episodes"),
        (lambda: DatasetConfig(video_backend="opencv"), "--dataset.video_backend"),
        (lambda: OptimizerConfig(type="lion"), "--optimizer.type"),
        (lambda: OptimizerConfig(lr=-1.0), "--optimizer.lr"),
        (lambda: OptimizerConfig(weight_decay=-0.1), "--optimizer.weight_decay"),
        (lambda: OptimizerConfig(betas=(0.9,)), "--optimizer.betas"),
        (lambda: OptimizerConfig(grad_clip_norm=-1.0), "--optimizer.grad_clip_norm"),
        (lambda: SchedulerConfig(type="step"), "--scheduler.type"),
        (lambda: SchedulerConfig(num_warmup_steps=-1), "--scheduler.num_warmup_steps"),
        (lambda: SchedulerConfig(num_decay_steps=-1), "--scheduler.num_decay_steps"),
        (lambda: SchedulerConfig(peak_lr=-1.0), "--scheduler.peak_lr"),
        (lambda: SchedulerConfig(decay_lr=-1.0), "--scheduler.decay_lr"),
        (lambda: PeftConfig(method_type="ia3"), "--peft.method_type"),
        (lambda: PeftConfig(r=0), "--peft.r"),
        (lambda: PeftConfig(lora_dropout=1.0), "--peft.lora_dropout"),
        (lambda: TrainConfig(steps=0), "--steps"),
        (lambda: TrainConfig(batch_size=0), "--batch_size"),
        (lambda: TrainConfig(num_workers=-1), "--num_workers"),
        (lambda: TrainConfig(log_freq=-1), "--log_freq"),
        (lambda: TrainConfig(save_freq=-1), "--save_freq"),
        (lambda: TrainConfig(checkpoint_format="pickle"), "pickle"),
        (lambda: config_class("mlp")(n_obs_steps=0), "--policy.n_obs_steps"),
        (lambda: config_class("mlp")(hidden_dim=0), "--policy.hidden_dim"),
    ],
)
def test_validator_rejects_and_names_the_flag(build, flag):
    with pytest.raises(ValueError, match=flag.replace(".", r"\.")):
        build()


def test_valid_values_pass():
    assert PeftConfig(method_type="lora").method_type == "LORA"
    assert DatasetConfig(episodes=[3, 1]).episodes == (3, 1)
    assert SchedulerConfig(type="constant_with_warmup", num_warmup_steps=2).num_warmup_steps == 2
    assert TrainConfig(num_workers=0, log_freq=0, save_freq=0).save_freq == 0
