"""What ``--dataset.streaming=true`` trains on: one dataset or a mixture, read episode by episode.

A streaming source (``lerobot_trainloop.streaming.StreamingDataSource``) needs two things of its data:
the episodes' lengths in samples, and ``read(episode, frames) -> items``. :class:`StreamedDataset` gives
both over one :class:`~lerobot_cli.datasets.episode_reader.EpisodeReader` per dataset: the episodes of
every part in order, each counting the frames that may start a sample (a policy that drops the last
``n`` frames of an episode, as diffusion does, has ``length - n``; an episode with no such frame is left
out), and a mixture's items labelled as a map-style mixture's are (renames, ``dataset_index``, the united
``task_index``), so a streamed batch has the same keys and values as a map-style one.
"""

from __future__ import annotations

from collections.abc import Sequence

from lerobot_cli.datasets.config import DatasetSource
from lerobot_cli.datasets.errors import DatasetError
from lerobot_cli.datasets.metadata import MetaView
from lerobot_cli.datasets.mixing import MixtureMeta
from lerobot_cli.datasets.mixture import MixtureLabels


class StreamedDataset(MetaView):
    """The episodes of ``parts`` (``EpisodeReader``s; several: a mixture of ``sources``) as one list.

    ``lengths[i]`` is episode ``i``'s number of sample starts (its frames minus ``drop_last``), and
    ``read(i, offsets)`` the items starting at those frame offsets of it."""

    def __init__(
        self, parts: Sequence, sources: Sequence[DatasetSource] | None = None, drop_last: int = 0
    ) -> None:
        self.parts = list(parts)
        if len(self.parts) > 1 and (sources is None or len(sources) != len(self.parts)):
            raise ValueError("a streamed mixture needs one DatasetSource per part")
        self.sources = list(sources or [])
        self.meta = (
            MixtureMeta([p.meta for p in self.parts], self.sources) if self.is_mixture else self.parts[0].meta
        )
        self._labels = MixtureLabels(self.meta) if self.is_mixture else None
        self.drop_last = drop_last
        self.episodes: list[tuple[int, int]] = [
            (d, e) for d, part in enumerate(self.parts) for e, n in enumerate(part.lengths) if n > drop_last
        ]
        self.lengths: list[int] = [self.parts[d].lengths[e] - drop_last for d, e in self.episodes]
        if not self.episodes:
            raise DatasetError(
                f"--policy.drop_n_last_frames={drop_last} leaves no frame to train on: every selected "
                f"episode has at most {drop_last} frames; lower it, or select longer episodes"
            )

    @property
    def is_mixture(self) -> bool:
        return len(self.parts) > 1

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources] if self.is_mixture else [str(self.parts[0].root)]

    @property
    def sizes(self) -> list[int]:
        """Sample starts per part."""
        sizes = [0] * len(self.parts)
        for (d, _), n in zip(self.episodes, self.lengths, strict=True):
            sizes[d] += n
        return sizes

    @property
    def num_samples(self) -> int:
        return sum(self.lengths)

    def read(self, episode: int, frames: Sequence[int]) -> list[dict]:
        d, e = self.episodes[episode]
        items = self.parts[d].read(e, frames)
        if self._labels is None:
            return items
        return [self._labels(d, item) for item in items]

    def __repr__(self) -> str:
        return f"StreamedDataset({', '.join(map(repr, self.parts))})"
