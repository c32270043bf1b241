"""A tokenizer directory that names its own Python code (``auto_map`` + a ``.py`` file) is refused with
one sentence and never run, and transformers is always called with ``trust_remote_code=False``, so its
"Do you wish to run the custom code? [y/N]" prompt cannot appear. The end-to-end rows (the flag, and a
``--policy.path`` whose ``policy_preprocessor.json`` names such a directory) are in
tests/data/bad_inputs.json."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.cli.checks import check_runnable
from lerobot_cli.cli.errors import UsageError
from lerobot_cli.custom_code import CustomCodeError, refuse_custom_code, tokenizers_named_in

CODE = (
    "from pathlib import Path\n"
    "Path(__file__).with_name('RAN').write_text('ran')\n"
    "class CustomTokenizer: pass\n"
)


def custom_code_dir(
    root: Path, tiny_tokenizer_dir: Path | None = None, in_file: str = "tokenizer_config.json"
) -> Path:
    """A tokenizer directory whose ``auto_map`` names ``custom_tok.py``, which leaves ``RAN`` when run."""
    root.mkdir(parents=True, exist_ok=True)
    if tiny_tokenizer_dir is not None:  # a real tokenizer.json beside the custom code
        (root / "tokenizer.json").write_bytes((tiny_tokenizer_dir / "tokenizer.json").read_bytes())
    config = {
        "tokenizer_class": "CustomTokenizer",
        "auto_map": {"AutoTokenizer": ["custom_tok.CustomTokenizer", None]},
    }
    (root / in_file).write_text(json.dumps(config))
    (root / "custom_tok.py").write_text(CODE)
    return root


@pytest.mark.parametrize("in_file", ["tokenizer_config.json", "config.json"])
def test_a_directory_with_an_auto_map_is_refused_by_name(tmp_path, in_file):
    directory = custom_code_dir(tmp_path / "tok", in_file=in_file)
    with pytest.raises(CustomCodeError) as exc:
        refuse_custom_code(str(directory))
    message = exc.value.naming("--policy.tokenizer_name")
    assert message.startswith(
        f"--policy.tokenizer_name={directory}: its {in_file} has an auto_map that names "
        "custom Python code (custom_tok.py)"
    )
    assert "never runs code" in message and "\n" not in message
    assert not (directory / "RAN").exists()


def test_plain_directories_and_hub_ids_pass(tiny_tokenizer_dir):
    refuse_custom_code(str(tiny_tokenizer_dir))
    refuse_custom_code("google/paligemma-3b-pt-224")
    refuse_custom_code(None)


def test_the_loader_refuses_it_without_running_it(tmp_path, tiny_tokenizer_dir):
    from lerobot_cli.processors.tokenizer import TokenizerStep

    directory = custom_code_dir(tmp_path / "tok", tiny_tokenizer_dir)
    with pytest.raises(CustomCodeError, match="auto_map"):
        TokenizerStep(tokenizer_name=str(directory)).tokenizer  # noqa: B018 - the property loads it
    assert not (directory / "RAN").exists()


def test_transformers_is_told_not_to_trust_remote_code(tmp_path, tiny_tokenizer_dir, monkeypatch):
    """Past our own check (a Hub repo is only known once transformers fetched it), transformers itself must
    refuse: with trust_remote_code unset it would ask on the terminal (answering y runs the file)."""
    from lerobot_cli.processors import tokenizer

    asked = []

    def prompted(*args, **kwargs):  # transformers turns any failure of its prompt into its own ValueError
        asked.append(args)
        return "n"

    directory = custom_code_dir(tmp_path / "tok", tiny_tokenizer_dir)
    monkeypatch.setattr(tokenizer, "refuse_custom_code", lambda name: None)
    monkeypatch.setattr(builtins, "input", prompted)
    with pytest.raises(CustomCodeError, match="it names custom Python code"):
        tokenizer.load_tokenizer(str(directory))
    assert asked == [] and not (directory / "RAN").exists()


def _config(*flags: str):
    return build_train_config(dict(f.removeprefix("--").split("=", 1) for f in flags)).config.finalized()


def test_the_flag_is_refused_before_torch(tmp_path):
    directory = custom_code_dir(tmp_path / "tok")
    cfg = _config("--dataset.repo_id=a/b", "--policy.type=pi0", f"--policy.tokenizer_name={directory}")
    with pytest.raises(UsageError, match=rf"^--policy.tokenizer_name={directory}: its tokenizer_config.json"):
        check_runnable(cfg, None)


def test_a_pretrained_pipeline_naming_it_is_refused_before_torch(tmp_path):
    from lerobot_cli import configio
    from lerobot_cli.policies import config_class

    directory = custom_code_dir(tmp_path / "tok")
    pretrained = tmp_path / "pretrained_model"
    pretrained.mkdir()
    (pretrained / "config.json").write_text(
        json.dumps(configio.unstructure_policy_config(config_class("mlp")()))
    )
    pipeline = {
        "name": "policy_preprocessor",
        "steps": [
            {"registry_name": "to_batch_processor", "config": {}},
            {
                "registry_name": "tokenizer_processor",
                "config": {"tokenizer_name": str(directory), "max_length": 8},
            },
        ],
    }
    (pretrained / "policy_preprocessor.json").write_text(json.dumps(pipeline))
    assert tokenizers_named_in(pretrained / "policy_preprocessor.json") == [str(directory)]
    cfg = _config("--dataset.repo_id=a/b", f"--policy.path={pretrained}")
    with pytest.raises(UsageError) as exc:
        check_runnable(cfg, None)
    assert str(exc.value).startswith(
        f"{pretrained.resolve() / 'policy_preprocessor.json'}: tokenizer_name={directory}: "
        "its tokenizer_config.json has an auto_map"
    )
