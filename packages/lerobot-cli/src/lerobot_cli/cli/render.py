"""Library messages in the CLI's words: config paths become the flags a user types (one place).

``lerobot_parallel`` (and ``lerobot_trainloop``) name settings by config path —
``parallelism.dp_shard``, ``accelerator.fsdp.wrap_modules``, ``accelerator.fsdp.mixed_precision_policy.*``
— and the device by its ``device=`` argument, because a foreign trainer builds those configs in
code and has no flags (see ``lerobot_parallel.errors``). ``TrainConfig`` nests the same configs
under the same names, so every such path is a flag here. :func:`as_flags` rewrites exactly the
paths ``TrainConfig`` has (read from the ``field_specs`` the parser and ``--help`` use, so a new
field is covered without a list to update) into ``--path``; a dotted name it does not have, or
text that is a flag already, is left alone. Where a library calls such paths "settings"
(``the parallelism.* / accelerator.* settings of this run``), the CLI's word is "flags". Every place
the CLI prints an error, a warning or the sharding plan passes its text through here.
"""

from __future__ import annotations

import re
from functools import cache

LIBRARY_SECTIONS = ("parallelism", "accelerator", "ema")  # the TrainConfig sections the library configs fill
# Library arguments the CLI fills from a flag of another name (the runner passes --policy.device as device=),
# and the run settings lerobot_ckpt's messages name by config path (policy.path=, checkpoint_format=).
ARGUMENTS = {
    "device": "policy.device",
    "policy.path": "policy.path",
    "checkpoint_format": "checkpoint_format",
}

_NOT_AFTER = r"(?<![\w.\-/])"  # not inside a flag (--x), an attribute chain (cfg.x) or a file path (a/x)
_SECTION = rf"(?:{'|'.join(LIBRARY_SECTIONS)})"
_PATH = re.compile(_NOT_AFTER + rf"({_SECTION}(?:\.\w+)*)(\.\*)?")
_ONE_PATH = rf"{_SECTION}(?:\.\w+)*(?:\.\*)?"
# "parallelism.* / accelerator.* settings": the library's word for what the CLI calls flags
_NAMED_SETTINGS = re.compile(_NOT_AFTER + rf"({_ONE_PATH}(?: / {_ONE_PATH})*) settings\b")
_ARGUMENT = re.compile(_NOT_AFTER + rf"({'|'.join(map(re.escape, ARGUMENTS))})=")


@cache
def flag_paths() -> frozenset[str]:
    """Every leaf flag below the library sections, and every section between (``accelerator.fsdp``)."""
    from lerobot_cli.cli.schema import field_specs
    from lerobot_cli.config import TrainConfig

    leaves = [s.path for s in field_specs(TrainConfig) if s.path.split(".")[0] in LIBRARY_SECTIONS]
    sections = {p.rsplit(".", k)[0] for p in leaves for k in range(1, p.count(".") + 1)}
    return frozenset(leaves) | sections


def _flag(match: re.Match[str]) -> str:
    path, wildcard = match.group(1), match.group(2) or ""
    known = flag_paths()
    if path in known and (wildcard or "." in path):
        return f"--{path}{wildcard}"
    return match.group(0)


def _settings_as_flags(match: re.Match[str]) -> str:
    paths = match.group(1)
    flags = _PATH.sub(_flag, paths)
    if flags.count("--") != len(_PATH.findall(paths)):  # one of them is no flag here: leave the words alone
        return match.group(0)
    return f"{flags} flags"


def as_flags(text: str) -> str:
    """``text`` with each config path ``TrainConfig`` has as a flag spelled ``--path`` (and ``device=``
    as ``--policy.device=``, "``<paths> settings``" as "``<flags> flags``"); everything else unchanged,
    so applying it twice changes nothing."""
    text = _NAMED_SETTINGS.sub(_settings_as_flags, str(text))
    text = _PATH.sub(_flag, text)
    return _ARGUMENT.sub(lambda m: f"--{ARGUMENTS[m.group(1)]}=", text)
