"""The language step: a batch's task strings become token ids and an attention mask.

``TokenizerStep`` is LeRobot's ``tokenizer_processor`` (same config keys and values, so either side reads
the other's ``policy_preprocessor.json``) on our flat batch dict: it reads ``batch["task"]`` (one string or
a list) and writes ``observation.language.tokens`` (int64) and ``observation.language.attention_mask``
(bool), plus the ``observation.subtask.*`` pair when the batch carries a ``subtask``.

The tokenizer is a ``transformers.AutoTokenizer`` loaded from ``tokenizer_name`` (a Hub name or a local
directory) on first use, not when the step is built: reading a pipeline file must not need the
tokenizer, nor import ``transformers``. A tokenizer that cannot be found raises ``TokenizerUnavailableError``
(one sentence: which tokenizer, and the two ways to make it available) instead of transformers' long
connection or validation errors. One that comes with its own Python code is never run: it raises
``CustomCodeError`` (see ``lerobot_cli.custom_code``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from lerobot_cli.custom_code import (
    TOKENIZER_STEP,
    CustomCodeError,
    is_custom_code_refusal,
    refuse_custom_code,
)
from lerobot_cli.processors.steps import Batch, ProcessorStep, register_step

TOKENS = "observation.language.tokens"
ATTENTION_MASK = "observation.language.attention_mask"
SUBTASK_TOKENS = "observation.subtask.tokens"
SUBTASK_ATTENTION_MASK = "observation.subtask.attention_mask"
PADDING_SIDES = ("right", "left")
PADDINGS = ("max_length", "longest", "do_not_pad")


class TokenizerUnavailableError(ValueError):
    """A named tokenizer is neither a local directory, nor cached, nor downloadable right now."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(_unavailable_message(name, reason))

    def naming(self, setting: str) -> str:
        """The message with the tokenizer setting spelled as the caller's users know it (the CLI: a flag)."""
        return _unavailable_message(self.name, self.reason, setting)


def _first_sentence(text: str) -> str:
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    return line.split(". ")[0].rstrip(".")


def _unavailable_message(name: str, reason: str, setting: str = "policy.tokenizer_name") -> str:
    fix = (
        f"set {setting} to a local tokenizer directory (one that save_pretrained wrote: "
        "tokenizer.json and tokenizer_config.json)"
    )
    if Path(name).expanduser().is_dir():
        return f"tokenizer directory {name!r} holds no tokenizer transformers can load ({reason}); {fix}"
    from huggingface_hub import constants

    return (
        f"tokenizer {name!r} is neither a local directory nor in the Hugging Face cache "
        f"({constants.HF_HUB_CACHE}), and the Hub could not provide it ({reason}); download it once "
        f"with network access (`hf download {name}`, after accepting its license on the Hub if it is "
        f"gated) or {fix}"
    )


def load_tokenizer(name: str) -> Any:
    """``AutoTokenizer.from_pretrained(name, trust_remote_code=False)``, with a missing tokenizer reported as
    one sentence (:class:`TokenizerUnavailableError`) and one that comes with its own Python code refused
    (:class:`~lerobot_cli.custom_code.CustomCodeError`): never run, and never a "[y/N]" prompt on a rank."""
    refuse_custom_code(name)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=False)
    except (OSError, ValueError) as exc:  # offline / not cached / gated / bad repo id / empty directory
        if is_custom_code_refusal(exc):  # a Hub repo whose tokenizer exists only as its own code
            raise CustomCodeError(name, "it names custom Python code (auto_map) for its tokenizer") from None
        raise TokenizerUnavailableError(name, _first_sentence(exc) or type(exc).__name__) from exc


def _texts(value: Any, key: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError(
        f"tokenizer_processor: batch[{key!r}] must be a string or a list of strings, "
        f"got {type(value).__name__}"
    )


def _device_of(batch: Batch) -> torch.device | None:
    """Where the batch already lives (first observation tensor, else the action), as LeRobot decides."""
    for key, value in batch.items():
        if key.startswith("observation") and isinstance(value, Tensor):
            return value.device
    action = batch.get("action")
    return action.device if isinstance(action, Tensor) else None


@register_step
class TokenizerStep(ProcessorStep):
    """Tokenize ``batch[task_key]`` with padding/truncation to ``max_length`` (LeRobot's rules)."""

    registry_name: ClassVar[str] = TOKENIZER_STEP

    def __init__(
        self,
        tokenizer_name: str | None = None,
        max_length: int = 512,
        task_key: str = "task",
        padding_side: str = "right",
        padding: str = "max_length",
        truncation: bool = True,
    ) -> None:
        if not tokenizer_name:
            raise ValueError(
                "tokenizer_processor needs a tokenizer_name (a Hub name or a local tokenizer directory)"
            )
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"tokenizer_processor: max_length must be an integer ≥ 1, got {max_length!r}")
        if padding_side not in PADDING_SIDES:
            raise ValueError(
                f"tokenizer_processor: invalid padding_side {padding_side!r} (choose from "
                f"{', '.join(PADDING_SIDES)})"
            )
        if padding not in PADDINGS:
            raise ValueError(
                f"tokenizer_processor: invalid padding {padding!r} (choose from {', '.join(PADDINGS)})"
            )
        self.tokenizer_name = str(tokenizer_name)
        self.max_length = max_length
        self.task_key = task_key
        self.padding_side = padding_side
        self.padding = padding
        self.truncation = bool(truncation)
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        """The loaded tokenizer (loaded on first access; ask for it early to fail before training starts)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.tokenizer_name)
        return self._tokenizer

    def tokenize(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """``(input_ids int64, attention_mask bool)``, each ``(len(texts), length)``, on the CPU."""
        encoded = self.tokenizer(
            list(texts),
            max_length=self.max_length,
            truncation=self.truncation,
            padding=self.padding,
            padding_side=self.padding_side,
            return_tensors="pt",
        )
        return encoded["input_ids"].to(torch.long), encoded["attention_mask"].to(torch.bool)

    def __call__(self, batch: Batch) -> Batch:
        if batch.get(self.task_key) is None:
            raise ValueError(
                f"tokenizer_processor: the batch has no {self.task_key!r} text to tokenize "
                f"(keys: {', '.join(sorted(batch))})"
            )
        device = _device_of(batch)
        out = dict(batch)
        pairs = [(self.task_key, TOKENS, ATTENTION_MASK)]
        if batch.get("subtask") is not None:
            pairs.append(("subtask", SUBTASK_TOKENS, SUBTASK_ATTENTION_MASK))
        for key, tokens_key, mask_key in pairs:
            tokens, mask = self.tokenize(_texts(batch[key], key))
            out[tokens_key] = tokens if device is None else tokens.to(device)
            out[mask_key] = mask if device is None else mask.to(device)
        return out

    def get_config(self) -> dict[str, Any]:
        # LeRobot's keys in LeRobot's order, so the JSON files are byte-equal
        return {
            "max_length": self.max_length,
            "task_key": self.task_key,
            "padding_side": self.padding_side,
            "padding": self.padding,
            "truncation": self.truncation,
            "tokenizer_name": self.tokenizer_name,
        }
