"""Names of the LeRobot v3.0 on-disk layout, in one place.

These strings are LeRobot's own (``lerobot/datasets/utils.py`` and ``lerobot_dataset.py`` of the v3.0
codebase); a dataset written by LeRobot must be readable without conversion, and one written here must
load with LeRobot's ``LeRobotDataset``, so nothing below may drift from upstream.
"""

from __future__ import annotations

from lerobot_cli import features as _features

CODEBASE_VERSION = "v3.0"
SUPPORTED_VERSIONS: tuple[str, ...] = ("v3.0",)

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
CHUNK_FILE_PATTERN = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DEFAULT_EPISODES_PATH = EPISODES_DIR + "/" + CHUNK_FILE_PATTERN + ".parquet"
DEFAULT_DATA_PATH = "data/" + CHUNK_FILE_PATTERN + ".parquet"
DEFAULT_VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE_PATTERN + ".mp4"

DEFAULT_CHUNK_SIZE = 1000  # max files per chunk directory
DEFAULT_DATA_FILE_SIZE_IN_MB = 100
DEFAULT_VIDEO_FILE_SIZE_IN_MB = 500

# Columns every data file carries besides the features; LeRobot lists them in info.json too.
DEFAULT_FEATURES: dict[str, dict] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}

NUMERIC_DTYPES: tuple[str, ...] = (
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
)
VISUAL_DTYPES: tuple[str, ...] = _features.VISUAL_DTYPES  # ("image", "video"), named once for policies too

# meta/episodes columns (per episode row).
EP_INDEX = "episode_index"
EP_TASKS = "tasks"
EP_LENGTH = "length"
EP_FROM = "dataset_from_index"
EP_TO = "dataset_to_index"
EP_DATA_CHUNK = "data/chunk_index"
EP_DATA_FILE = "data/file_index"
EP_META_CHUNK = "meta/episodes/chunk_index"
EP_META_FILE = "meta/episodes/file_index"
STATS_PREFIX = "stats/"


def video_column(video_key: str, field: str) -> str:
    """``videos/<key>/{chunk_index,file_index,from_timestamp,to_timestamp}`` in meta/episodes."""
    return f"videos/{video_key}/{field}"


def update_chunk_file_indices(chunk_index: int, file_index: int, chunks_size: int) -> tuple[int, int]:
    """The next (chunk, file) pair, rolling into a new chunk directory after ``chunks_size`` files."""
    if file_index == chunks_size - 1:
        return chunk_index + 1, 0
    return chunk_index, file_index + 1
