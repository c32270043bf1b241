"""pi0/pi05 processors: tokenizer step, prompt steps, quantile normalization, relative actions, the
per-policy step-list hook and the saved pipelines. The tokenizer is the tiny one the tests build
(vla_tokenizer.py); nothing here touches the network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import ClassVar

import numpy as np
import pytest
import torch
from attrs import define, field
from lerobot_cli.features import NormalizationMode, PolicyFeature
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.pi0.prompts import Pi0NewLineStep
from lerobot_cli.policies.pi05.prompts import Pi05StateTokensStep
from lerobot_cli.policies.spec import PolicySpec
from lerobot_cli.processors import (
    AbsoluteActionsStep,
    MissingStatsError,
    ProcessorPipeline,
    RelativeActionsStep,
    TokenizerStep,
    TokenizerUnavailableError,
    load_processors,
    make_pre_post_processors,
    save_processors,
)
from lerobot_cli.processors.factory import ProcessorStepsError
from lerobot_cli.processors.tokenizer import ATTENTION_MASK, SUBTASK_ATTENTION_MASK, SUBTASK_TOKENS, TOKENS
from transformers import AutoTokenizer

FEATURES_IN = {
    "observation.state": PolicyFeature("STATE", (3,)),
    "observation.images.top": PolicyFeature("VISUAL", (3, 4, 4)),
}
FEATURES_OUT = {"action": PolicyFeature("ACTION", (2,))}
TASKS = ["pick_up the cube", "Move the blue dot onto the red target.\n"]


@define(frozen=True, kw_only=True)
class Pi0Like(PolicyConfig):
    """The fields the pi0 step lists read, without the model (whose config lives elsewhere)."""

    type: ClassVar[str] = "pi0_processors_test"
    spec: ClassVar[PolicySpec] = PolicySpec(
        model="tests:Unused", processors="lerobot_cli.policies.pi0.processors:pi0_processor_steps"
    )

    normalization_mapping: dict[str, NormalizationMode] = field(
        factory=lambda: {
            "VISUAL": NormalizationMode.IDENTITY,
            "STATE": NormalizationMode.MEAN_STD,
            "ACTION": NormalizationMode.MEAN_STD,
        }
    )
    tokenizer_name: str = "google/paligemma-3b-pt-224"
    tokenizer_max_length: int = 48
    max_state_dim: int = 32
    use_relative_actions: bool = False
    relative_exclude_joints: list[str] = field(factory=lambda: ["gripper"])
    action_feature_names: list[str] | None = None


@define(frozen=True, kw_only=True)
class Pi05Like(Pi0Like):
    type: ClassVar[str] = "pi05_processors_test"
    spec: ClassVar[PolicySpec] = PolicySpec(
        model="tests:Unused", processors="lerobot_cli.policies.pi05.processors:pi05_processor_steps"
    )


def _stats():
    return {
        "observation.state": {
            "mean": [0.5, -0.5, 0.0],
            "std": [2.0, 1.0, 0.5],
            "min": [-2.0, -3.0, -1.0],
            "max": [2.0, 1.0, 1.0],
            "q01": [-1.5, -2.0, -1.0],
            "q99": [1.5, 0.5, 1.0],
            "q10": [-1.0, -1.0, -0.5],
            "q90": [1.0, 0.0, 0.5],
        },
        "action": {
            "mean": [0.1, 0.2],
            "std": [1.0, 2.0],
            "min": [-1.0, -2.0],
            "max": [1.0, 2.0],
            "q01": [-0.8, -1.5],
            "q99": [0.9, 1.5],
            "q10": [-0.5, -1.0],
            "q90": [0.5, 1.0],
        },
    }


def _batch(seed: int = 0, tasks=TASKS):
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.state": torch.randn(len(tasks), 3, generator=g),
        "observation.images.top": torch.rand(len(tasks), 3, 4, 4, generator=g),
        "action": torch.randn(len(tasks), 5, 2, generator=g),
        "task": list(tasks),
    }


# ---------------------------------------------------------------- tokenizer step


@pytest.mark.parametrize(("max_length", "padding_side"), [(48, "right"), (12, "right"), (12, "left")])
def test_tokenizer_step_equals_transformers(tiny_tokenizer_dir, max_length, padding_side):
    step = TokenizerStep(
        tokenizer_name=str(tiny_tokenizer_dir), max_length=max_length, padding_side=padding_side
    )
    out = step(_batch())
    ref = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))(
        TASKS,
        max_length=max_length,
        truncation=True,
        padding="max_length",
        padding_side=padding_side,
        return_tensors="pt",
    )
    assert out[TOKENS].dtype == torch.long and out[ATTENTION_MASK].dtype == torch.bool
    assert out[TOKENS].shape == (2, max_length)
    assert torch.equal(out[TOKENS], ref["input_ids"])
    assert torch.equal(out[ATTENTION_MASK], ref["attention_mask"].bool())
    assert int(out[TOKENS].max()) < 1000
    if max_length == 12:  # the second task is longer than 12 tokens: truncated, no padding
        assert bool(out[ATTENTION_MASK][1].all())
    assert out["task"] == TASKS  # the text stays for steps and logs that want it


def test_tokenizer_step_one_string_subtask_and_device(tiny_tokenizer_dir):
    step = TokenizerStep(tokenizer_name=str(tiny_tokenizer_dir), max_length=8)
    out = step({"task": "go", "subtask": ["grasp"], "action": torch.zeros(1, 2, dtype=torch.float64)})
    assert out[TOKENS].shape == (1, 8) and out[ATTENTION_MASK][0].tolist() == [True] * 3 + [False] * 5
    assert out[SUBTASK_TOKENS].shape == (1, 8) and int(out[SUBTASK_ATTENTION_MASK].sum()) == 6
    assert out[TOKENS].device == out["action"].device


def test_tokenizer_step_config_is_lerobots_and_loads_lazily():
    step = TokenizerStep(tokenizer_name="no/such-tokenizer", max_length=48)
    assert list(step.get_config().items()) == [
        ("max_length", 48),
        ("task_key", "task"),
        ("padding_side", "right"),
        ("padding", "max_length"),
        ("truncation", True),
        ("tokenizer_name", "no/such-tokenizer"),
    ]
    again = TokenizerStep.from_config(step.get_config())  # nothing loaded: no tokenizer needed to read a file
    assert again.get_config() == step.get_config()
    with pytest.raises(ValueError, match="padding_side"):
        TokenizerStep(tokenizer_name="x", padding_side="middle")
    with pytest.raises(ValueError, match="has no 'task'"):
        TokenizerStep(tokenizer_name="x")({"observation.state": torch.zeros(1, 2)})


def test_missing_hub_tokenizer_offline_is_one_sentence(tmp_path):
    # HF_HUB_OFFLINE is read when huggingface_hub is imported: a fresh interpreter with an empty cache
    code = (
        "from lerobot_cli.processors import TokenizerStep, TokenizerUnavailableError\n"
        "step = TokenizerStep(tokenizer_name='google/paligemma-3b-pt-224')\n"
        "try:\n    step({'task': ['x']})\n"
        "except TokenizerUnavailableError as exc:\n    print(exc)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_CACHE", None)
    env.pop("HUGGINGFACE_HUB_CACHE", None)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, check=False, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    message = result.stdout.strip()
    assert "\n" not in message and message.count(". ") == 0, message
    assert "'google/paligemma-3b-pt-224'" in message and str(tmp_path / "hf") in message
    assert "hf download google/paligemma-3b-pt-224" in message and "policy.tokenizer_name" in message


def test_local_tokenizer_errors_are_one_sentence(tmp_path):
    for name in (str(tmp_path), str(tmp_path / "missing")):  # an empty directory, a path that is not one
        with pytest.raises(TokenizerUnavailableError) as info:
            TokenizerStep(tokenizer_name=name)({"task": ["x"]})
        message = str(info.value)
        assert repr(name) in message and "\n" not in message and "policy.tokenizer_name" in message
        assert isinstance(info.value, ValueError)


# ---------------------------------------------------------------- prompt steps


def test_pi0_newline_step():
    step = Pi0NewLineStep()
    assert step({"task": "a"})["task"] == "a\n"
    assert step({"task": ["a", "b\n"]})["task"] == ["a\n", "b\n"]
    batch = {"task": None, "x": 1}
    assert step(batch) is batch and step({"x": 1}) == {"x": 1}
    assert step.get_config() == {}


def test_pi05_state_prompt_worked_example():
    state = torch.tensor(
        [[-1.0, 0.0, 0.999, 1.0, -1.5, 1.5, 0.5], [0.0078125, 0.0078124, -0.9921875, 0, 0, 0, 0]]
    )
    out = Pi05StateTokensStep()({"observation.state": state, "task": ["  pick_up the cube\n", "stack\nthem"]})
    # bins are [-1 + 2k/256, -1 + 2(k+1)/256): -1 → 0, 0 → 128, ≥ 1 - 2/256 → 255, below -1 → -1
    assert out["task"] == [
        "Task: pick up the cube, State: 0 128 255 255 -1 255 192;\nAction: ",
        "Task: stack them, State: 129 128 1 128 128 128 128;\nAction: ",
    ]
    assert out["observation.state"] is state
    assert Pi05StateTokensStep().get_config() == {}  # LeRobot's file: its defaults, unsaid
    assert Pi05StateTokensStep(max_state_dim=8).get_config() == {"max_state_dim": 8}
    with pytest.raises(ValueError, match="one row per task"):
        Pi05StateTokensStep()({"observation.state": state, "task": ["only one"]})


def test_pi05_discretisation_equals_numpy_digitize():
    state = torch.linspace(-1.2, 1.2, 1001).reshape(1, -1)
    out = Pi05StateTokensStep()({"observation.state": state, "task": ["t"]})["task"][0]
    bins = out.split("State: ")[1].split(";")[0].split()
    expected = np.digitize(state.numpy(), np.linspace(-1, 1, 257)[:-1]) - 1
    assert (
        [int(b) for b in bins] == expected[0].tolist() and min(expected[0]) == -1 and max(expected[0]) == 255
    )


# ---------------------------------------------------------------- quantile normalization


@pytest.mark.parametrize(("mode", "low", "high"), [("QUANTILES", "q01", "q99"), ("QUANTILE10", "q10", "q90")])
def test_quantile_normalization_formula_and_round_trip(mode, low, high):
    mapping = {
        "VISUAL": NormalizationMode.IDENTITY,
        "STATE": NormalizationMode(mode),
        "ACTION": NormalizationMode(mode),
    }
    cfg = Pi0Like(input_features=FEATURES_IN, output_features=FEATURES_OUT, normalization_mapping=mapping)
    stats = _stats()
    stats["observation.state"][high][2] = stats["observation.state"][low][
        2
    ]  # zero range: eps, not a division by 0
    pre, post = make_pre_post_processors(cfg, stats)
    norm = pre.step("normalizer_processor")
    batch = _batch()
    out = norm(batch)
    lo, hi = torch.tensor(stats["observation.state"][low]), torch.tensor(stats["observation.state"][high])
    span = torch.where(hi - lo == 0, torch.tensor(1e-8), hi - lo)
    torch.testing.assert_close(out["observation.state"], 2.0 * (batch["observation.state"] - lo) / span - 1.0)
    assert torch.equal(out["observation.images.top"], batch["observation.images.top"])
    torch.testing.assert_close(post(out["action"]), batch["action"], rtol=1e-6, atol=1e-6)
    unnorm = post.step("unnormalizer_processor")
    a_lo, a_hi = torch.tensor(stats["action"][low]), torch.tensor(stats["action"][high])
    assert torch.equal(
        unnorm({"action": out["action"]})["action"], (out["action"] + 1.0) * (a_hi - a_lo) / 2.0 + a_lo
    )


def test_quantiles_missing_stats_are_named():
    cfg = Pi05Like(
        input_features=FEATURES_IN,
        output_features=FEATURES_OUT,
        normalization_mapping={"STATE": NormalizationMode.QUANTILES, "ACTION": NormalizationMode.QUANTILE10},
    )
    stats = {
        k: {s: v for s, v in per.items() if s in ("mean", "std", "min", "max")} for k, per in _stats().items()
    }
    with pytest.raises(MissingStatsError) as info:
        make_pre_post_processors(cfg, stats)
    assert info.value.missing == [
        ("observation.state", "q01"),
        ("observation.state", "q99"),
        ("action", "q10"),
        ("action", "q90"),
    ]


# ---------------------------------------------------------------- relative actions


def test_relative_actions_round_trip_with_excluded_joint():
    relative = RelativeActionsStep(
        enabled=True, exclude_joints=["gripper"], action_names=["x", "gripper_pos"]
    )
    absolute = AbsoluteActionsStep(enabled=True, relative_step=relative)
    batch = _batch()
    out = relative(batch)
    state = batch["observation.state"]
    torch.testing.assert_close(out["action"][..., 0], batch["action"][..., 0] - state[:, None, 0])
    assert torch.equal(out["action"][..., 1], batch["action"][..., 1])  # the gripper stays absolute
    torch.testing.assert_close(absolute({"action": out["action"]})["action"], batch["action"])
    off = RelativeActionsStep()
    assert off(batch) is batch and off.last_state is state  # off: unchanged, the state still remembered
    with pytest.raises(RuntimeError, match="paired"):
        AbsoluteActionsStep(enabled=True)({"action": out["action"]})


# ---------------------------------------------------------------- step lists, hook, files

PI0_PRE = [
    "rename_observations_processor",
    "to_batch_processor",
    "pi0_new_line_processor",
    "tokenizer_processor",
    "device_processor",
    "relative_actions_processor",
    "normalizer_processor",
]
PI05_PRE = [
    "rename_observations_processor",
    "to_batch_processor",
    "relative_actions_processor",
    "normalizer_processor",
    "pi05_prepare_state_tokenizer_processor_step",
    "tokenizer_processor",
    "device_processor",
]
POST = ["unnormalizer_processor", "absolute_actions_processor", "device_processor"]


@pytest.mark.parametrize(
    ("cls", "pre_names", "normalizer_file"),
    [
        (Pi0Like, PI0_PRE, "policy_preprocessor_step_6_normalizer_processor.safetensors"),
        (Pi05Like, PI05_PRE, "policy_preprocessor_step_3_normalizer_processor.safetensors"),
    ],
)
def test_vla_pipelines_save_and_load(tmp_path, tiny_tokenizer_dir, cls, pre_names, normalizer_file):
    mapping = {
        "VISUAL": NormalizationMode.IDENTITY,
        "STATE": NormalizationMode.QUANTILES,
        "ACTION": NormalizationMode.QUANTILES,
    }
    cfg = cls(
        input_features=FEATURES_IN,
        output_features=FEATURES_OUT,
        normalization_mapping=mapping,
        tokenizer_name=str(tiny_tokenizer_dir),
        tokenizer_max_length=64,
    )
    pre, post = make_pre_post_processors(cfg, _stats())
    assert [s.registry_name for s in pre.steps] == pre_names and [s.registry_name for s in post.steps] == POST
    written = {p.name for p in save_processors(pre, post, tmp_path)}
    assert written == {
        "policy_preprocessor.json",
        normalizer_file,
        "policy_postprocessor.json",
        "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
    }
    pre2, post2 = load_processors(tmp_path)
    assert pre2.get_config() == pre.get_config() and post2.get_config() == post.get_config()
    assert json.loads((tmp_path / "policy_preprocessor.json").read_text()) == pre.get_config()
    tokenizer = next(s for s in pre2.steps if isinstance(s, TokenizerStep))
    assert tokenizer.get_config()["tokenizer_name"] == str(tiny_tokenizer_dir)
    assert tokenizer.max_length == 64
    absolute = post2.step("absolute_actions_processor")
    assert absolute.relative_step is pre2.step("relative_actions_processor")  # re-paired on load
    batch = _batch()
    a, b = pre(batch), pre2(batch)
    assert a["task"] == b["task"] and a["task"] != batch["task"]  # newline or state prompt
    for key in (TOKENS, ATTENTION_MASK, "observation.state", "action"):
        assert torch.equal(a[key], b[key]), key
    assert torch.equal(post(a["action"]), post2(b["action"]))


def test_pi05_tokens_are_the_state_prompts(tiny_tokenizer_dir):
    cfg = Pi05Like(
        input_features=FEATURES_IN,
        output_features=FEATURES_OUT,
        tokenizer_name=str(tiny_tokenizer_dir),
        normalization_mapping={"STATE": NormalizationMode.MEAN_STD, "ACTION": NormalizationMode.MEAN_STD},
    )
    pre, _ = make_pre_post_processors(cfg, _stats())
    batch = _batch()
    out = pre(batch)
    normalized = pre.step("normalizer_processor")(batch)["observation.state"]
    prompts = Pi05StateTokensStep()({"observation.state": normalized, "task": TASKS})["task"]
    ref = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))(
        prompts,
        max_length=48,
        truncation=True,
        padding="max_length",
        padding_side="right",
        return_tensors="pt",
    )
    assert out["task"] == prompts and torch.equal(out[TOKENS], ref["input_ids"])


def test_pi0_relative_actions_on_when_the_config_says_so(tiny_tokenizer_dir):
    cfg = Pi0Like(
        input_features=FEATURES_IN,
        output_features=FEATURES_OUT,
        tokenizer_name=str(tiny_tokenizer_dir),
        use_relative_actions=True,
        action_feature_names=["x", "gripper"],
    )
    pre, post = make_pre_post_processors(cfg, _stats())
    relative = pre.step("relative_actions_processor")
    assert relative.get_config() == {
        "enabled": True,
        "exclude_joints": ["gripper"],
        "action_names": ["x", "gripper"],
    }
    assert post.step("absolute_actions_processor").relative_step is relative
    batch = _batch()
    out = pre(batch)
    # relative first, then normalized: unnormalize + absolute gives the raw actions back
    torch.testing.assert_close(post(out["action"]), batch["action"], rtol=1e-5, atol=1e-5)


def test_config_without_hook_keeps_the_default_pipelines():
    @define(frozen=True, kw_only=True)
    class Plain(PolicyConfig):
        type: ClassVar[str] = "plain_processors_test"
        spec: ClassVar[PolicySpec] = PolicySpec(model="tests:Unused")  # no processors: the defaults

    pre, post = make_pre_post_processors(
        Plain(input_features=FEATURES_IN, output_features=FEATURES_OUT),
        _stats() | {"observation.images.top": {"mean": [0.0] * 3, "std": [1.0] * 3}},
    )
    assert [s.registry_name for s in pre.steps] == [
        "rename_observations_processor",
        "to_batch_processor",
        "device_processor",
        "normalizer_processor",
    ]
    assert [s.registry_name for s in post.steps] == ["unnormalizer_processor", "device_processor"]


def test_hook_naming_nothing_importable_is_refused():
    @define(frozen=True, kw_only=True)
    class Broken(PolicyConfig):
        type: ClassVar[str] = "broken_processors_test"
        spec: ClassVar[PolicySpec] = PolicySpec(
            model="tests:Unused", processors="lerobot_cli.policies.pi0.processors:no_such_function"
        )

    with pytest.raises(
        ProcessorStepsError, match="Broken.spec.processors names 'lerobot_cli.policies.pi0.processors:no_such"
    ):
        make_pre_post_processors(
            Broken(input_features=FEATURES_IN, output_features=FEATURES_OUT, normalization_mapping={}), {}
        )


def test_pipeline_file_with_every_new_step_loads(tmp_path):
    """A fresh interpreter that imports only the pipeline module reads a file using all new steps: the
    policy-specific ones (pi0's, pi05's) come from their policy folders, registered under LeRobot's names
    when the file names them (through the specs' processors modules)."""
    config = {
        "name": "policy_preprocessor",
        "steps": [
            {"registry_name": "pi0_new_line_processor", "config": {}},
            {
                "registry_name": "relative_actions_processor",
                "config": {"enabled": False, "exclude_joints": ["gripper"], "action_names": None},
            },
            {
                "registry_name": "pi05_prepare_state_tokenizer_processor_step",
                "config": {},
            },  # as LeRobot writes it
            {
                "registry_name": "tokenizer_processor",
                "config": {
                    "max_length": 48,
                    "task_key": "task",
                    "padding_side": "right",
                    "padding": "max_length",
                    "truncation": True,
                    "tokenizer_name": "google/paligemma-3b-pt-224",
                },
            },
        ],
    }
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps(config))
    code = (
        "import sys\nfrom lerobot_cli.processors.pipeline import ProcessorPipeline\n"
        f"p = ProcessorPipeline.from_pretrained({str(tmp_path)!r}, 'policy_preprocessor.json')\n"
        "print(p.get_config() == __import__('json').load(open(sys.argv[1])))\n"
        "print(*[type(s).__module__ for s in p.steps])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "policy_preprocessor.json")],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    modules = [
        "lerobot_cli.policies.pi0.prompts",
        "lerobot_cli.processors.relative",
        "lerobot_cli.policies.pi05.prompts",
        "lerobot_cli.processors.tokenizer",
    ]
    assert result.stdout.splitlines() == ["True", " ".join(modules)], result.stdout + result.stderr
    assert ProcessorPipeline.from_pretrained(tmp_path, "policy_preprocessor.json").get_config() == config
