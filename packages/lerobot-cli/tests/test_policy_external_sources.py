"""The policy contract's hooks for what a policy reads from outside the run's dataset and checkpoints:
``external_sources()`` (each resolved before any heavy work, a missing one a ``UsageError`` line; init-only
ones not on a resume; none by a dry run), ``initial_weights()`` (loaded over a fresh policy by
``weights.build_policy`` with LeRobot's cross-embodiment rule, never on the meta device, said in the banner)
and ``tokenizer()`` (a ``Source``: the custom-code refusal names the policy's own flag). A policy registered
for these tests only shows that the runner asks the hooks and nothing else of a policy."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import ClassVar

import attrs
import pytest
import torch
from attrs import define, field
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.cli.checks import check_custom_code, check_external_sources, check_runnable
from lerobot_cli.cli.errors import UsageError
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies import registry
from lerobot_cli.policies.config import InitialWeights, Source
from lerobot_cli.policies.mlp.config import MLPConfig
from lerobot_cli.policies.spec import PolicySpec
from lerobot_cli.policies.weights import build_policy, load_initial_weights, save_pretrained


def _directory(flag: str, value: str) -> Path:
    path = Path(value)
    if not path.is_dir():
        raise ValueError(f"{flag}={value}: no such directory; download it with `get {value}`")
    return path


@define(frozen=True, kw_only=True)
class SourcedConfig(MLPConfig):
    """The mlp policy reading a frozen directory and, when fresh, starting from another policy's weights."""

    type: ClassVar[str] = "sourced_mlp"
    spec: ClassVar[PolicySpec] = attrs.evolve(MLPConfig.spec, init_only_fields=("start_from",))

    frozen_dir: str | None = None
    start_from: str | None = field(default=None, metadata={"help": "Weights a fresh policy starts from."})
    vocab: str | None = None

    def external_sources(self) -> tuple[Source, ...]:
        sources = []
        for flag, value in (
            ("--policy.frozen_dir", self.frozen_dir),
            ("--policy.start_from", self.start_from),
        ):
            if value:
                sources.append(Source(flag, value, lambda flag=flag, value=value: _directory(flag, value)))
        return tuple(sources)

    def initial_weights(self) -> InitialWeights | None:
        if not self.start_from:
            return None
        return InitialWeights(f"the weights of {self.start_from}", Path(self.start_from))

    def tokenizer(self) -> Source | None:
        return Source("--policy.vocab", self.vocab) if self.vocab else None


@pytest.fixture
def sourced(monkeypatch):
    monkeypatch.setitem(registry._REGISTERED, SourcedConfig.type, SourcedConfig)
    return SourcedConfig


def _run(*flags: str):
    return build_train_config(dict(f.removeprefix("--").split("=", 1) for f in flags)).config.finalized()


def _features(state: int) -> dict:
    return {
        "input_features": {"observation.state": PolicyFeature(FeatureType.STATE, (state,))},
        "output_features": {"action": PolicyFeature(FeatureType.ACTION, (2,))},
    }


def test_a_missing_source_stops_the_run_in_its_own_line_before_any_work(sourced, tmp_path):
    present = tmp_path / "frozen"
    present.mkdir()
    base = ["--dataset.repo_id=a/b", "--policy.type=sourced_mlp"]
    check_runnable(_run(*base, f"--policy.frozen_dir={present}"), None)  # present: nothing said
    missing = tmp_path / "elsewhere"
    with pytest.raises(UsageError) as exc:
        check_runnable(_run(*base, f"--policy.frozen_dir={missing}"), None)
    assert (
        str(exc.value)
        == f"--policy.frozen_dir={missing}: no such directory; download it with `get {missing}`"
    )
    with pytest.raises(UsageError, match=r"^--policy.start_from=.*elsewhere: no such directory"):
        check_runnable(_run(*base, f"--policy.frozen_dir={present}", f"--policy.start_from={missing}"), None)


def test_a_resume_does_not_need_what_only_fresh_weights_read_and_a_dry_run_reads_nothing(sourced, tmp_path):
    missing = str(tmp_path / "elsewhere")
    cfg = _run("--dataset.repo_id=a/b", "--policy.type=sourced_mlp", f"--policy.start_from={missing}")
    with pytest.raises(UsageError, match="--policy.start_from"):
        check_external_sources(cfg)
    check_external_sources(attrs.evolve(cfg, resume=True))  # init-only: the checkpoint's weights win
    check_external_sources(attrs.evolve(cfg, dry_run=True))
    frozen = attrs.evolve(cfg, policy=attrs.evolve(cfg.policy, frozen_dir=missing), resume=True)
    with pytest.raises(UsageError, match="--policy.frozen_dir"):  # read on a resume too
        check_external_sources(frozen)


def test_the_tokenizer_hook_names_the_policys_own_flag(sourced, tmp_path):
    directory = tmp_path / "tok"
    directory.mkdir()
    (directory / "tokenizer_config.json").write_text('{"auto_map": {"AutoTokenizer": ["tok.Custom", null]}}')
    cfg = _run("--dataset.repo_id=a/b", "--policy.type=sourced_mlp", f"--policy.vocab={directory}")
    with pytest.raises(
        UsageError, match=rf"^--policy.vocab={directory}: its tokenizer_config.json has an auto_map"
    ):
        check_custom_code(cfg)
    check_custom_code(attrs.evolve(cfg, policy=attrs.evolve(cfg.policy, vocab=None)))


def _fresh(state: int, **fields) -> torch.nn.Module:
    torch.manual_seed(state)
    return build_policy(SourcedConfig(**_features(state), **fields))


def test_a_fresh_policy_starts_from_its_initial_weights_other_shapes_kept_fresh(sourced, tmp_path, caplog):
    """LeRobot's cross-embodiment rule (FastWAM's _load_as_safetensor, strict=False): every tensor of the
    same name and shape is loaded, one of another shape keeps its fresh value, one warning names it."""
    source = _fresh(4)
    save_pretrained(source, source.config, tmp_path / "base")
    fresh = _fresh(6)  # another state width: the input projection's weight differs
    with caplog.at_level(logging.WARNING, logger="lerobot_cli.policies.weights"):
        started = _fresh(6, start_from=str(tmp_path / "base"))
    own, theirs, ours = started.state_dict(), source.state_dict(), fresh.state_dict()
    assert torch.equal(own["input_proj.weight"], ours["input_proj.weight"])  # [hidden, 6] vs [hidden, 4]
    loaded = [k for k in own if k != "input_proj.weight"]
    assert loaded and all(torch.equal(own[k], theirs[k]) for k in loaded)
    assert not torch.equal(theirs["input_proj.bias"], ours["input_proj.bias"])  # it was read, not kept
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert (
        "1 tensors of other shapes (another action or state width) keep their fresh initialisation: "
        in (warnings[0])
    )
    assert warnings[0].endswith("input_proj.weight")
    with pytest.raises(ValueError, match=r"1 tensors have other shapes .*\(strict load\): input_proj.weight"):
        load_initial_weights(fresh, tmp_path / "base" / "model.safetensors", strict=True)


def test_same_shapes_load_silently_and_saved_weights_never_read_them(sourced, tmp_path, caplog):
    source = _fresh(4)
    save_pretrained(source, source.config, tmp_path / "base")
    with caplog.at_level(logging.WARNING, logger="lerobot_cli.policies.weights"):
        started = _fresh(4, start_from=str(tmp_path / "base"))
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in started.state_dict().items())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # init-only: the field is written null, so a policy loaded from these files never reads its base
    saved = save_pretrained(started, started.config, tmp_path / "again")
    assert '"start_from": null' in (saved / "config.json").read_text()


def test_the_meta_device_reads_no_initial_weights(sourced, tmp_path):
    with torch.device("meta"):  # the dry run: shapes only, and the directory need not exist
        policy = build_policy(SourcedConfig(**_features(4), start_from=str(tmp_path / "nowhere")))
    assert all(p.device.type == "meta" for p in policy.parameters())
    with pytest.raises(FileNotFoundError):  # off the meta device the same config reads it
        build_policy(SourcedConfig(**_features(4), start_from=str(tmp_path / "nowhere")))


def test_the_banner_says_what_a_fresh_policy_starts_from(sourced, tmp_path):
    from lerobot_cli.banner import banner_lines
    from lerobot_cli.config import TrainConfig
    from lerobot_cli.datasets.config import DatasetConfig
    from lerobot_parallel.runtime import ParallelRuntime

    policy = _fresh(4)

    def lines(policy_cfg, resume=False):
        run = TrainConfig(
            dataset=DatasetConfig(repo_id="a/b"),
            policy=policy_cfg,
            job_name="j",
            output_dir="o",
            resume=resume,
        )
        return [
            ln
            for ln in banner_lines(run, ParallelRuntime.single("cpu"), policy, 10, 2)
            if ln.startswith("Initial weights")
        ]

    cfg = SourcedConfig(**_features(4), start_from="/base")
    assert lines(cfg) == ["Initial weights: the weights of /base"]
    assert lines(cfg, resume=True) == []  # the checkpoint's
    assert lines(SourcedConfig(**_features(4))) == []
