"""``--sample_weighting.*`` (LeRobot's RA-BC): the config's LeRobot defaults and refusals, the weights of a
hand-made progress file against hand-computed values, the one-line refusals of malformed files, pi0's
per-sample loss, and the weighted loss the hooks put on a policy.
(``tools/interop/sample_weighting_lerobot_interop.py`` compares all of it with LeRobot itself.)"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lerobot_cli.cli.argv import split_argv
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.cli.checks import check_runnable, check_sample_weighting
from lerobot_cli.errors import ConfigError
from lerobot_cli.policies import registry
from lerobot_cli.sample_weighting.config import SampleWeightingConfig
from lerobot_cli.sample_weighting.loss import weight_the_loss, weighted_mean
from lerobot_cli.sample_weighting.weights import (
    RABCWeights,
    UniformWeighter,
    make_sample_weighter,
    progress_location,
    read_progress,
    resolve_progress_path,
)
from torch import nn


def build(*flags: str, policy: str = "pi0"):
    return build_train_config(
        split_argv(["--dataset.repo_id=org/x", f"--policy.type={policy}", *flags]).flags
    )


# ------------------------------------------------------------------------------------------------ config
def test_the_config_has_lerobots_fields_and_defaults():
    cfg = build("--sample_weighting.kappa=0.01").config.sample_weighting
    assert cfg == SampleWeightingConfig()
    assert (cfg.type, cfg.progress_path, cfg.head_mode, cfg.kappa, cfg.epsilon, cfg.extra_params) == (
        "rabc", None, "sparse", 0.01, 1e-6, {})  # fmt: skip
    assert build().config.sample_weighting is None  # off unless a flag names it (LeRobot: None)
    assert build("--sample_weighting=null").config == build().config
    cfg = build(
        "--sample_weighting.type=rabc",
        "--sample_weighting.progress_path=p.parquet",
        "--sample_weighting.head_mode=dense",
        '--sample_weighting.extra_params={"fallback_weight": 0.5}',
    ).config.sample_weighting
    assert (cfg.progress_path, cfg.head_mode, cfg.extra_params) == (
        "p.parquet",
        "dense",
        {"fallback_weight": 0.5},
    )


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("--sample_weighting.type=foo", "--sample_weighting.type: invalid choice 'foo'"),
        ('--sample_weighting.extra_params={"chunk": 3}', "'chunk' is not a parameter of"),
        ("--sample_weighting.kappa=nan", "--sample_weighting.kappa must be a finite number"),
        ("--sample_weighting.progress_path= ", "--sample_weighting.progress_path must name a parquet file"),
    ],
)
def test_bad_values_are_refused_in_one_line(flag, says):
    with pytest.raises(ConfigError) as err:
        build(flag)
    assert says in str(err.value) and "\n" not in str(err.value)


# Which policies have LeRobot's per-sample loss: each spec's per_sample_loss (the registry's, not a list).
WITH = [name for name in registry.available() if registry.config_class(name).spec.per_sample_loss]
WITHOUT = [name for name in registry.available() if name not in WITH]


def test_the_policies_with_a_per_sample_loss_are_lerobots():
    assert {"pi0", "pi05"} <= set(WITH) and {"act", "diffusion", "mlp"} <= set(WITHOUT)


@pytest.mark.parametrize("policy", WITHOUT)
def test_a_policy_without_a_per_sample_loss_is_refused_naming_those_with_one(policy):
    """Its own check (FastWAM and SmolVLA at their defaults stop earlier in check_runnable, on weights not
    in the cache); check_runnable runs it for act below."""
    result = build("--sample_weighting.type=uniform", policy=policy)
    with pytest.raises(ConfigError) as err:
        check_sample_weighting(result.config)
    message = str(err.value)
    assert message.startswith("--sample_weighting.type=uniform: policy " + policy)
    assert message.endswith(f"sample weighting supports {', '.join(WITH)}") and "\n" not in message


def test_a_run_without_a_per_sample_loss_is_refused_before_it_starts():
    with pytest.raises(ConfigError, match="policy act has no per-sample loss"):
        check_runnable(build("--sample_weighting.type=uniform", policy="act").config, None)


def test_a_mixture_is_refused():
    result = build("--sample_weighting.type=rabc", '--dataset.repo_id=["org/a","org/b"]')
    with pytest.raises(ConfigError, match="a dataset mixture is not weighted here"):
        check_runnable(result.config, None)


def test_the_policies_with_a_per_sample_loss_pass_the_checks():
    for policy in WITH:
        check_runnable(build("--sample_weighting.type=rabc", policy=policy).config, None)


def test_the_progress_file_is_found_where_lerobot_looks():
    cfg = SampleWeightingConfig()
    assert progress_location(cfg, "data/ds", "org/x") == "data/ds/sarm_progress.parquet"
    assert progress_location(cfg, None, "org/x") == "hf://datasets/org/x/sarm_progress.parquet"
    assert progress_location(SampleWeightingConfig(progress_path="a.parquet"), "d", "o/x") == "a.parquet"
    assert str(resolve_progress_path("rel/p.parquet")) == "rel/p.parquet"  # the working directory's
    with pytest.raises(ConfigError, match="only a local file or hf://datasets/"):
        resolve_progress_path("s3://bucket/p.parquet")
    with pytest.raises(ConfigError, match="expected hf://datasets/<owner>/<name>/<file"):
        resolve_progress_path("hf://datasets/org/x")


def test_an_hf_path_goes_through_the_hub_cache_and_a_failure_is_one_line(monkeypatch, tmp_path):
    import huggingface_hub

    calls = []

    def download(**kwargs):
        calls.append(kwargs)
        if kwargs["repo_id"] == "org/missing":
            raise OSError("offline\nand more")
        return str(tmp_path / "f.parquet")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    assert resolve_progress_path("hf://datasets/org/x/sub/p.parquet") == tmp_path / "f.parquet"
    assert calls[0] == {"repo_id": "org/x", "filename": "sub/p.parquet", "repo_type": "dataset"}
    with pytest.raises(ConfigError) as err:
        resolve_progress_path("hf://datasets/org/missing/p.parquet")
    assert str(err.value).endswith("could not download it (OSError: offline)")


# ------------------------------------------------------------------------------------------------ weights
# Two episodes: 0 is frames 0-4, 1 is frames 5-7 (frame 6 without a progress value); chunk_size 2.
ROWS = {
    "index": [0, 1, 2, 3, 4, 5, 6, 7],
    "episode_index": [0, 0, 0, 0, 0, 1, 1, 1],
    "progress_sparse": [0.0, 0.1, 0.3, 0.3, 0.2, 0.5, math.nan, 0.4],
}
# By hand: delta = progress[min(t + 2, last of episode)] - progress[t]
HAND_DELTAS = {0: 0.3, 1: 0.2, 2: -0.1, 3: -0.1, 4: 0.0, 5: -0.1, 7: 0.0}


def write(path, columns: dict, schema=None):
    pq.write_table(pa.table(columns, schema=schema), path)
    return path


@pytest.fixture
def progress_file(tmp_path):
    return write(tmp_path / "sarm_progress.parquet", {**ROWS, "progress_dense": [0.0] * 8})


def test_the_weights_of_a_hand_made_file_are_the_hand_computed_ones(progress_file):
    cfg = SampleWeightingConfig()
    w = make_sample_weighter(cfg, chunk_size=2, device=torch.device("cpu"), path=progress_file, num_frames=10)
    assert isinstance(w, RABCWeights)
    deltas = list(HAND_DELTAS.values())
    mean = sum(deltas) / 7
    std = math.sqrt(sum((d - mean) ** 2 for d in deltas) / 7)
    assert w.delta_mean == pytest.approx(mean, rel=1e-12) and w.delta_std == pytest.approx(std, rel=1e-12)
    got = w.deltas([0, 1, 2, 3, 4, 5, 6, 7, 9])
    for i, d in HAND_DELTAS.items():
        assert got[i] == pytest.approx(d, abs=1e-15), i
    assert np.isnan(got[6]) and np.isnan(got[8])  # no progress value; a frame the file lacks
    soft = (0.0 - (mean - 2 * std)) / (4 * std + 1e-6)  # deltas in [0, kappa]: frames 4 and 7
    weights, stats = w.compute_batch_weights({"index": torch.tensor([0, 2, 4, 6, 9])})
    raw = [1.0, 0.0, soft, 1.0, 1.0]  # > kappa: 1; negative: 0; no delta: fallback 1
    expected = [x * 5 / (sum(raw) + 1e-6) for x in raw]
    assert weights.dtype == torch.float32 and weights.tolist() == pytest.approx(expected, rel=1e-6)
    assert stats["mean_weight"] == pytest.approx(sum(raw) / 5, rel=1e-6)
    assert (stats["num_zero_weight"], stats["num_full_weight"]) == (1, 3)
    assert w.get_stats() == {
        "type": "rabc", "num_frames": 7, "chunk_size": 2, "head_mode": "sparse",
        "delta_mean": w.delta_mean, "delta_std": w.delta_std, "kappa": 0.01,
    }  # fmt: skip


def test_fallback_weight_kappa_and_head_mode_are_used(progress_file):
    cfg = SampleWeightingConfig(kappa=0.25, extra_params={"fallback_weight": 0.5})
    w = make_sample_weighter(cfg, chunk_size=2, device=torch.device("cpu"), path=progress_file)
    # 0.3 > 0.25: 1; 0.2 <= 0.25: soft (< 1); no delta: 0.5
    raw = w.weights_of(w.deltas([0, 1, 6]))
    assert raw[0] == 1.0 and 0 < raw[1] < 1 and raw[2] == 0.5
    dense = make_sample_weighter(
        SampleWeightingConfig(head_mode="dense"), chunk_size=2, device=torch.device("cpu"), path=progress_file
    )
    assert dense.delta_mean == 0.0 and dense.delta_std == 1e-6  # every delta 0: std floored at epsilon


def test_uniform_weights_are_ones():
    w = UniformWeighter(torch.device("cpu"))
    weights, stats = w.compute_batch_weights({"action": torch.zeros(3, 2)})
    assert weights.tolist() == [1.0, 1.0, 1.0] and stats == {"mean_weight": 1.0, "type": "uniform"}


@pytest.mark.parametrize(
    ("columns", "says"),
    [
        ({k: v for k, v in ROWS.items() if k != "progress_sparse"} | {"progress_dense": [0.0] * 8},
         ("column 'progress_sparse' not found (--sample_weighting.head_mode picks progress_<head_mode>). "
          "Available progress columns: ['progress_dense']")),
        ({k: v for k, v in ROWS.items() if k != "episode_index"}, "column 'episode_index' not found"),
        ({**ROWS, "index": [0, 1, 2, 3, 4, 5, 6, 6]}, "frame index 6 appears more than once"),
        ({**ROWS, "index": [0, 1, 2, 3, 4, 5, 6, 12]},
         "row 7 names frame 12 of episode 1, outside the dataset (the dataset has frames 0..9)"),
        ({**ROWS, "index": [-1, 1, 2, 3, 4, 5, 6, 7]}, "row 0 names frame -1"),
        ({**ROWS, "index": [0.0, 1, 2, 3, 4, 5, 6, 7]}, "column 'index' must hold integers, not double"),
        ({**ROWS, "index": [None, 1, 2, 3, 4, 5, 6, 7]}, "column 'index' has 1 empty values"),
        ({**ROWS, "progress_sparse": [0.0, math.inf, 0, 0, 0, 0, 0, 0]}, "has infinite values"),
        ({**ROWS, "progress_sparse": ["a"] * 8}, "column 'progress_sparse' must hold numbers, not string"),
        ({k: [] for k in ROWS}, "the file has no rows"),
    ],
)  # fmt: skip
def test_a_malformed_file_is_refused_in_one_line_naming_the_flag_and_the_file(tmp_path, columns, says):
    if not columns["index"]:
        schema = pa.schema(
            [("index", pa.int64()), ("episode_index", pa.int64()), ("progress_sparse", pa.float32())]
        )
        path = write(tmp_path / "p.parquet", columns, schema)
    else:
        path = write(tmp_path / "p.parquet", columns)
    with pytest.raises(ConfigError) as err:
        read_progress(path, "progress_sparse", num_frames=10)
    message = str(err.value)
    assert message.startswith(f"--sample_weighting.progress_path {path}: ") and "\n" not in message
    assert says in message


def test_a_file_that_is_not_parquet_or_missing_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    for path, says in ((bad, "not a readable parquet file"), (tmp_path / "none.parquet", "no such file")):
        with pytest.raises(ConfigError) as err:
            read_progress(path, "progress_sparse")
        assert str(err.value).startswith(f"--sample_weighting.progress_path {path}: {says}")
        assert "\n" not in str(err.value)


def test_null_progress_values_have_no_delta_as_lerobots_nan(tmp_path):
    path = write(
        tmp_path / "p.parquet", {**ROWS, "progress_sparse": [0.0, 0.1, 0.3, 0.3, 0.2, 0.5, None, 0.4]}
    )
    index, _, progress = read_progress(path, "progress_sparse")
    assert np.isnan(progress[6]) and progress.dtype == np.float64 and index.dtype == np.int64


# ------------------------------------------------------------------------------------------------ loss
class PerSample(nn.Module):
    """forward(batch, reduction): LeRobot's contract; the per-sample loss is the batch's ``l``."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, batch, reduction="mean"):
        losses = batch["l"] * self.scale
        return (losses if reduction == "none" else losses.mean()), {"part": 1.0}


class Fixed:
    def compute_batch_weights(self, batch):
        return torch.tensor([0.5, 0.0, 2.0]), {"mean_weight": 0.8, "num_zero_weight": 1, "type": "x"}


def test_the_hooks_make_training_use_lerobots_weighted_mean_and_eval_the_plain_one():
    model = PerSample()
    remove = weight_the_loss(model, Fixed())
    batch = {"l": torch.tensor([1.0, 2.0, 3.0])}
    loss, info = model(batch)
    assert loss.item() == pytest.approx((1 * 0.5 + 3 * 2.0) / (2.5 + 1e-6), rel=1e-6)
    assert torch.equal(loss, weighted_mean(batch["l"], torch.tensor([0.5, 0.0, 2.0])))
    assert info == {"part": 1.0, "sample_weight_mean_weight": 0.8, "sample_weight_num_zero_weight": 1.0}
    loss.backward()
    assert model.scale.grad.item() == pytest.approx(6.5 / 2.5)
    model.eval()  # the held-out loss: unweighted, as LeRobot's eval
    assert model(batch) == (torch.tensor(2.0), {"part": 1.0})
    model.train()
    remove()
    assert model(batch)[0].item() == 2.0


def tiny_pi0(policy: str = "pi0"):
    from lerobot_cli.features import FeatureType, PolicyFeature
    from lerobot_cli.policies.registry import config_class
    from lerobot_cli.policies.weights import build_policy

    config = config_class(policy)(
        paligemma_variant="gemma_tiny",
        action_expert_variant="gemma_tiny",
        vision_variant="tiny",
        image_resolution=(56, 56),
        chunk_size=4,
        n_action_steps=4,
        tokenizer_max_length=8,
        input_features={
            "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 56, 56)),
            "observation.state": PolicyFeature(FeatureType.STATE, (6,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (6,))},
    )
    torch.manual_seed(0)
    return build_policy(config)


def pi_batch(n: int = 3) -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "observation.images.top": torch.rand(n, 3, 56, 56, generator=g),
        "observation.state": torch.randn(n, 6, generator=g),
        "action": torch.randn(n, 4, 6, generator=g),
        "observation.language.tokens": torch.randint(0, 300, (n, 8), generator=g),
        "observation.language.attention_mask": torch.arange(8)[None] < torch.tensor([[8], [5], [3]][:n]),
        "index": torch.tensor([3, 17, 40][:n]),
    }


@pytest.mark.parametrize("policy", ["pi0", "pi05"])
def test_pi_per_sample_losses_average_to_the_mean_loss(policy):
    model = tiny_pi0(policy)
    batch = pi_batch()
    torch.manual_seed(5)
    mean, _ = model(batch)
    torch.manual_seed(5)  # the same flow noise and time (drawn per sample from the index)
    per_sample, info = model(batch, reduction="none")
    assert per_sample.shape == (3,) and info == {}
    assert per_sample.mean().item() == pytest.approx(mean.item(), rel=1e-6)
    assert len(set(per_sample.tolist())) == 3  # one loss per sample, not a broadcast mean
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'none'"):
        model(batch, reduction="sum")
