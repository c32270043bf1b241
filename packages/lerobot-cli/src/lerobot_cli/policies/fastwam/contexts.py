"""Each task's text context computed once, so the UMT5 encoder need not sit on every GPU while training.

FastWAM's context depends on the task text alone (``text.py``), and a dataset has few tasks (LIBERO: 40)
while UMT5-XXL is 11.4 GB in bf16 on every rank. ``precompute_task_contexts`` encodes each distinct task
once (e.g. on one process before the run, from the dataset's ``meta/tasks.parquet``) and
``TaskContexts.lookup`` gives a batch its ``context`` / ``context_mask``, which LeRobot's FastWAM batch
accepts in place of encoding ``task``: the run then needs neither the encoder nor its 11.4 GB per rank.
At full size a context is ``tokenizer_max_len × 4096`` values, 1 MiB per task in bf16 at length 128.

Equal to encoding on the fly: every prompt is padded to the same fixed length and the encoder attends
within one prompt, so a task's context does not depend on which prompts share its batch, up to the
floating-point rounding of a differently sized matrix product (the tests measure it).
Saved as one safetensors file: ``context [N, L, D]`` plus the tasks, template and encoder names in its
metadata, which ``load`` checks against what the run would encode with.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from attrs import field, frozen
from torch import Tensor

from lerobot_cli.policies.fastwam.text import PROMPT_TEMPLATE, PromptEncoder

CONTEXT = "context"


class TaskContextsError(ValueError):
    """A context file that does not fit the run (other tasks, template or encoder), or a task it lacks."""


def _unique(tasks: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(t) for t in tasks))


@frozen(eq=False)  # tensors: compared by identity
class TaskContexts:
    """The contexts of ``tasks`` (row i of ``context`` is ``tasks[i]``'s) and how they were made."""

    tasks: tuple[str, ...] = field(converter=_unique)
    context: Tensor  # [N, L, D], the encoder's dtype, padding positions zero
    template: str = PROMPT_TEMPLATE
    source: Mapping[str, str] = field(
        factory=dict
    )  # e.g. {"text_encoder": ..., "tokenizer": ..., "max_length": ...}

    def __attrs_post_init__(self) -> None:
        if self.context.ndim != 3 or self.context.shape[0] != len(self.tasks):
            raise TaskContextsError(
                f"context must be [tasks, length, dim] with {len(self.tasks)} rows, "
                f"got {tuple(self.context.shape)}"
            )

    @property
    def nbytes(self) -> int:
        return self.context.numel() * self.context.element_size()

    def lookup(
        self, tasks: str | Sequence[str], device: str | torch.device | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(context [B, L, D], context_mask [B, L] all true)`` for a batch's tasks."""
        tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        index = {task: i for i, task in enumerate(self.tasks)}
        missing = sorted({t for t in tasks if t not in index})
        if missing:
            raise TaskContextsError(
                f"no precomputed context for task(s) {missing[:3]!r} "
                f"({len(self.tasks)} tasks precomputed): recompute them for this dataset"
            )
        # pinned and non-blocking toward a GPU: a blocking upload from pageable memory waits for the stream
        rows = torch.tensor([index[t] for t in tasks], dtype=torch.long, pin_memory=self.context.is_cuda)
        rows = rows.to(self.context.device, non_blocking=True)
        context = self.context.index_select(0, rows)
        if device is not None:
            context = context.to(device)
        return context, torch.ones(context.shape[:2], dtype=torch.bool, device=context.device)

    def __deepcopy__(self, memo: dict) -> TaskContexts:
        return self  # read-only: an EMA shadow of the policy shares them

    def save(self, path: str | Path) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        metadata = {
            "tasks": json.dumps(list(self.tasks)),
            "template": self.template,
            "source": json.dumps(dict(self.source), sort_keys=True),
        }
        save_file({CONTEXT: self.context.contiguous()}, str(path), metadata=metadata)
        return path

    @classmethod
    def load(
        cls, path: str | Path, *, template: str | None = None, source: Mapping[str, str] | None = None
    ) -> TaskContexts:
        """Read a file ``save`` wrote; ``template`` and each ``source`` entry, when given, must be what it was
        made with (a context made by another encoder or prompt would silently condition on something else)."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            context = handle.get_tensor(CONTEXT)
        made = cls(
            tasks=json.loads(metadata.get("tasks", "[]")),
            context=context,
            template=metadata.get("template", PROMPT_TEMPLATE),
            source=json.loads(metadata.get("source", "{}")),
        )
        if template is not None and template != made.template:
            raise TaskContextsError(f"{path}: made with prompt template {made.template!r}, not {template!r}")
        differ = {k: v for k, v in (source or {}).items() if made.source.get(k) != str(v)}
        if differ:
            raise TaskContextsError(f"{path}: made with {dict(made.source)}, not {differ}")
        return made


def precompute_task_contexts(
    tasks: Iterable[str],
    encoder: PromptEncoder,
    *,
    template: str = PROMPT_TEMPLATE,
    batch_size: int = 8,
    source: Mapping[str, str] | None = None,
) -> TaskContexts:
    """Encode each distinct task once, ``batch_size`` prompts at a time; returned on the CPU."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    unique = _unique(tasks)
    if not unique:
        raise TaskContextsError("no tasks to encode")
    chunks = []
    for start in range(0, len(unique), batch_size):
        prompts = [template.format(task=t) for t in unique[start : start + batch_size]]
        context, _ = encoder.encode(prompts)
        chunks.append(context.cpu())
    return TaskContexts(
        tasks=unique,
        context=torch.cat(chunks),
        template=template,
        source={**(source or {}), "max_length": str(encoder.max_length)},
    )
