"""Which dataset a run reads (torch-free)."""

from __future__ import annotations

from attrs import define, field


def _episodes(value):
    if value is None:
        return None
    return tuple(value)


@define(frozen=True)
class DatasetConfig:
    """``repo_id`` names the dataset; ``root`` (used as is) overrides ``$HF_LEROBOT_HOME/<repo_id>``."""

    repo_id: str | None = field(default=None, metadata={"help": "Dataset name, e.g. lerobot/demo_reach."})
    root: str | None = field(
        default=None,
        metadata={"help": "Local dataset directory, used as is (default $HF_LEROBOT_HOME/<repo_id>)."},
    )
    episodes: tuple[int, ...] | None = field(
        default=None, converter=_episodes, metadata={"help": "Episode indices to train on, e.g. '[0,3,5]'."}
    )
    eval_split: float = field(
        default=0.0,
        metadata={
            "help": "Fraction of episodes held out per task for the eval loss (the last ones; 0: none); "
            "needs --eval_steps > 0."
        },
    )
    revision: str | None = field(default=None, metadata={"help": "Hub revision to download when not cached."})
    use_imagenet_stats: bool = field(
        default=True,
        metadata={
            "help": "Normalise every camera (depth maps aside) with ImageNet's mean and std instead of the "
            "dataset's, as LeRobot does by default (the cameras' other statistics stay the dataset's); "
            "processors loaded from --policy.path or a resumed checkpoint keep theirs."
        },
    )
    video_backend: str = field(default="pyav", metadata={"help": "Video decoder.", "choices": ("pyav",)})

    def __attrs_post_init__(self) -> None:
        if self.episodes is not None and not self.episodes:
            raise ValueError(
                "--dataset.episodes=[] selects no episode: give a non-empty JSON list of episode "
                "indices, e.g. '[0,3,5]', or leave it unset to train on all episodes"
            )
        if self.episodes is not None:
            bad = [e for e in self.episodes if isinstance(e, bool) or not isinstance(e, int) or e < 0]
            if bad or len(set(self.episodes)) != len(self.episodes):
                raise ValueError(
                    f"--dataset.episodes must be a JSON list of distinct episode indices ≥ 0, "
                    f"got {list(self.episodes)!r}"
                )
        split = self.eval_split
        if isinstance(split, bool) or not isinstance(split, int | float) or not 0.0 <= split < 1.0:
            raise ValueError(
                f"--dataset.eval_split must be a fraction in [0, 1), got {split!r} (e.g. 0.1 holds out "
                "the last 10% of each task's episodes; 0 holds out none)"
            )
        if self.video_backend not in ("pyav",):
            raise ValueError(
                f"--dataset.video_backend: invalid choice {self.video_backend!r} (choose from pyav)"
            )
