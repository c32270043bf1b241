"""LeRobot 0.6.1 ``lerobot-train`` flags whose feature this stack does not have (yet), and what they do here.

A LeRobot user arrives with the command they already run, and it must never end in ``unknown flag``. Each
flag below is either accepted as is, when its value keeps the feature off (LeRobot's own default, e.g.
``--wandb.enable=false``), or refused in one line
that says why and what to use instead. Flags whose feature exists here are ordinary config fields, not
listed here. ``tools/interop/flags_lerobot_interop.py`` reads LeRobot's own ``--help`` and checks every
flag against this stack.
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import define

from lerobot_cli.cli.errors import UsageError
from lerobot_cli.cli.schema import BOOLEAN_SPELLINGS

_FALSE = ("false", "0", "no", "off")
_TRUE = ("true", "1", "yes", "on")
_NULL = ("null", "none", "")


def _off(raw: str) -> bool:
    text = raw.strip().lower()
    if text not in _FALSE + _TRUE:
        raise UsageError(f"expected a boolean ({BOOLEAN_SPELLINGS}), got {raw!r}")
    return text in _FALSE


def _null(raw: str) -> bool:
    return raw.strip().lower() in _NULL


def _always(_raw: str) -> bool:
    return True


def _dataset_repo(raw: str) -> bool:
    return raw.strip() == "dataset"


def _local_job(raw: str) -> bool:
    return _null(raw) or raw.strip() == "local"


IMAGE_TRANSFORMS = (
    "a config file for the image transforms (--image_transforms=<file>) is not read here: pass their fields "
    "as flags (--dataset.image_transforms.enable=true, --dataset.image_transforms.tfs='{...}', ...)"
)
JOBS = (
    "Hugging Face Jobs (--job.target) are not launched from here: run the same command under torchrun or "
    "accelerate launch on the machines themselves (see the guide's Launching and Multi-node sections)"
)
REWARD = "reward model training (--reward_model.*) is not available here: train a policy with --policy.type"
BUCKETS = (
    "an HF Storage Bucket is not read here yet: stream a dataset repo "
    "(--dataset.streaming=true) or give its files' URL as --dataset.root"
)
DEPTH = (
    "depth maps are not dequantized here: --dataset.depth_output_unit takes only LeRobot's default, mm "
    "(it changes nothing for RGB cameras)"
)
SECTION_FILE = (
    "a section's own config file (--{name}=<file>) is not read here: pass its fields as flags "
    "(--{name}.<field>=...), or the whole run's config with --config_path"
)


@define(frozen=True)
class LeRobotOnly:
    """``flag`` (or every flag under ``flag.`` when ``section``): accepted when ``inert(raw)``, else
    refused with ``why``."""

    flag: str
    inert: Callable[[str], bool]
    why: str
    section: bool = False

    def matches(self, name: str) -> bool:
        return name == self.flag or (self.section and name.startswith(self.flag + "."))


TABLE: tuple[LeRobotOnly, ...] = (
    LeRobotOnly("image_transforms", _null, IMAGE_TRANSFORMS),  # LeRobot's file for the dataset's section
    LeRobotOnly("job", _null, JOBS),
    LeRobotOnly("job.target", _local_job, JOBS),
    LeRobotOnly("job", _always, JOBS, section=True),  # image, timeout, …: unused for a local run
    LeRobotOnly("reward_model", _null, REWARD),
    LeRobotOnly("reward_model", _null, REWARD, section=True),
    LeRobotOnly("dataset.repo_type", _dataset_repo, BUCKETS),
    LeRobotOnly("dataset.depth_output_unit", lambda raw: raw.strip() == "mm", DEPTH),
)
# --<section>=<file> in LeRobot's parser (optimizer, scheduler, peft: ours)
SECTIONS = ("dataset", "policy", "wandb", "eval")


def lerobot_only(name: str, raw: str) -> bool:
    """Whether ``--name=raw`` is a LeRobot flag accepted here as inert (True); raises UsageError when it
    is one this stack refuses; False when it is not one of them."""
    if name in SECTIONS:
        if _null(raw):
            return True  # no config file for the section: LeRobot's default
        raise UsageError(f"--{name}={raw}: " + SECTION_FILE.format(name=name))
    for entry in TABLE:
        if entry.matches(name):
            try:
                inert = entry.inert(raw)
            except UsageError as exc:
                raise UsageError(f"--{name}: {exc}") from None
            if inert:
                return True
            raise UsageError(f"--{name}={raw}: {entry.why}")
    return False
