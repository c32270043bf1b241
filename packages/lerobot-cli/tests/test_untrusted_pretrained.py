"""A pretrained directory someone sent (``--policy.path``) is read only inside itself, and every field
read from it is checked: each refusal a ``ValueError`` of one line naming the file and the entry.

Library level, in-process; ``tests/test_untrusted_policy_path.py`` runs the same crafted files
through ``lerobot-train``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from lerobot_ckpt.paths import UnsafePathError
from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.policies.features import PolicyFeature
from lerobot_cli.policies.location import links_root
from lerobot_cli.processors import load_processors, make_pre_post_processors, save_processors

STATE = "policy_preprocessor_step_3_normalizer_processor.safetensors"
PRE = "policy_preprocessor.json"


def _processors(directory: Path) -> Path:
    config = ACTConfig(
        input_features={"observation.state": PolicyFeature("STATE", (3,))},
        output_features={"action": PolicyFeature("ACTION", (2,))},
    )
    stats = {
        "observation.state": {"mean": [1.0, 2.0, 3.0], "std": [2.0, 4.0, 0.5]},
        "action": {"mean": [0.5, -1.0], "std": [2.0, 0.25]},
    }
    pre, post = make_pre_post_processors(config, stats)
    directory.mkdir(parents=True, exist_ok=True)
    save_processors(pre, post, directory)
    return directory


def _set_state_file(directory: Path, value: str) -> None:
    file = directory / PRE
    data = json.loads(file.read_text())
    data["steps"][3]["state_file"] = value
    file.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "crafted, why",
    [
        ("{outside}/" + STATE, "is an absolute path"),
        ("../outside/" + STATE, "is not a plain relative path"),
        ("sub/../" + STATE, "is not a plain relative path"),
        ("link.safetensors", "is a symlink"),
    ],
    ids=["absolute", "dotdot", "inner-dotdot", "symlink-out"],
)
def test_a_state_file_outside_its_directory_is_refused_before_it_is_read(tmp_path, crafted, why):
    """Each crafted name points at a valid state file elsewhere, which the old loader read silently."""
    outside = _processors(tmp_path / "outside")
    directory = _processors(tmp_path / "sent")
    os.symlink(outside / STATE, directory / "link.safetensors")
    _set_state_file(directory, crafted.replace("{outside}", str(outside)))
    with pytest.raises(UnsafePathError) as info:
        load_processors(directory)
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert str(directory / PRE) in message and "steps[3].state_file" in message and why in message


def test_a_missing_state_file_keeps_its_sentence(tmp_path):
    directory = _processors(tmp_path / "sent")
    (directory / STATE).unlink()
    with pytest.raises(FileNotFoundError, match=r"needs .*_processor.safetensors, which is missing"):
        load_processors(directory)


def _hub_snapshot(root: Path, source: Path, blob_root: Path | None = None) -> Path:
    """``source``'s files laid out as the Hub cache does: ``snapshots/<rev>/<name>`` a symlink into
    ``blobs/`` (of ``blob_root``, default the repository's own)."""
    repo = root / "models--org--name"
    blobs = (blob_root or repo) / "blobs"
    snapshot = repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(source.iterdir())):
        blob = blobs / f"blob{i}"
        shutil.copy(file, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    return snapshot


def test_a_hub_cache_snapshot_may_point_into_its_own_blobs_only(tmp_path):
    source = _processors(tmp_path / "source")
    snapshot = _hub_snapshot(tmp_path / "hub", source)
    assert links_root(snapshot) == tmp_path / "hub" / "models--org--name"
    assert links_root(source) is None
    pre, _ = load_processors(snapshot)
    assert pre.step("normalizer_processor").state_dict()

    stray = _hub_snapshot(tmp_path / "hub2", source, blob_root=tmp_path / "elsewhere")
    with pytest.raises(UnsafePathError, match=r"steps\[3\].state_file = .* is a symlink"):
        load_processors(stray)
