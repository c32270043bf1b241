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

    repo_id: str | None = None
    root: str | None = None
    episodes: tuple[int, ...] | None = field(default=None, converter=_episodes)
    revision: str | None = None
    video_backend: str = "pyav"

    def __attrs_post_init__(self) -> None:
        if self.episodes is not None:
            bad = [e for e in self.episodes if isinstance(e, bool) or not isinstance(e, int) or e < 0]
            if bad or len(set(self.episodes)) != len(self.episodes):
                raise ValueError(
                    f"--dataset.episodes must be a JSON list of distinct episode indices ≥ 0, "
                    f"got {list(self.episodes)!r}"
                )
        if self.video_backend not in ("pyav",):
            raise ValueError(f"--dataset.video_backend: invalid choice {self.video_backend!r} (choose from pyav)")
