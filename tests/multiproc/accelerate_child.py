"""Started by ``accelerate launch``: record what the launcher exported, apply the env guard
before torch is imported, and in ``examples`` mode run both README examples for real.

argv: <out_dir> <probe|examples>
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from _common import arm_watchdog
from lerobot_parallel.env_guard import AccelerateEnvError, enforce_accelerate_env_guard

REPO = Path(__file__).resolve().parents[2]
READMES = (REPO / "packages/lerobot-parallel/README.md", REPO / "packages/lerobot-trainloop/README.md")
_PREFIXES = (
    "ACCELERATE_",
    "FSDP_",
    "PARALLELISM_CONFIG_",
    "MASTER_",
    "KMP_",
    "TORCHELASTIC_",
    "GROUP_",
    "ROLE_",
)
_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS")


def readme_example(path: Path) -> str:
    """The python block under the README's '## Example' heading."""
    text = path.read_text()
    section = text[text.index("## Example") :]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def main() -> None:
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    arm_watchdog(120)
    exported = {k: v for k, v in os.environ.items() if k.startswith(_PREFIXES) or k in _NAMES}
    (out_dir / f"env-{os.getpid()}.json").write_text(json.dumps(exported, sort_keys=True))
    try:
        enforce_accelerate_env_guard("no")
    except AccelerateEnvError as exc:
        print(f"GUARD_REFUSED (torch imported: {'torch' in sys.modules})\n{exc}", file=sys.stderr)
        sys.exit(2)
    print(f"GUARD_PASSED rank={os.environ.get('RANK', 'none')}", flush=True)
    if mode == "examples":
        for path in READMES:
            exec(compile(readme_example(path), str(path), "exec"), {"__name__": "__main__"})  # noqa: S102
            print(f"EXAMPLE_DONE {path.parent.name} rank={os.environ.get('RANK')}", flush=True)


if __name__ == "__main__":
    main()
