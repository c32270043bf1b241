"""The registered policies as the tools outside this environment need them: names and spec metadata.

The interop drivers' LeRobot side and ``tools/interop/ci.sh`` run where lerobot-cli cannot be imported
(LeRobot's own Python 3.12 environment, or a shell). They used to keep their own lists of policy names and
of LeRobot extras, which a new policy silently escaped; now they ask this module, run in our environment
(``uv run python -m lerobot_cli.policies.manifest ...``), and hand its answer over the command line, so a
new policy is one folder and one registration. Torch-free: only config classes are imported.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from lerobot_cli.policies import registry


def policies() -> dict[str, dict[str, Any]]:
    """Every registered policy (built-in, plugin, registered in this process): what tools read of its spec."""
    out = {}
    for name in registry.available():
        spec = registry.spec_of(registry.config_class(name))
        out[name] = {
            "in_lerobot": spec.in_lerobot,
            "lerobot_extras": list(spec.lerobot_extras),
            "extras": list(spec.extras),
            "extension_fields": list(spec.extension_fields),
            "per_sample_loss": spec.per_sample_loss,
        }
    return out


def in_lerobot() -> list[str]:
    """The registered policies LeRobot 0.6.1 also has: the ones the interop drivers compare with LeRobot's."""
    return [name for name, meta in policies().items() if meta["in_lerobot"]]


def lerobot_extras() -> list[str]:
    """LeRobot's pip extras its classes of our policies need (``lerobot[pi,...]``), sorted, each once."""
    return sorted({extra for meta in policies().values() for extra in meta["lerobot_extras"]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "what",
        nargs="?",
        default="json",
        choices=["json", "names", "in-lerobot", "lerobot-extras"],
        help="json: every policy's metadata; the others: a comma-separated list",
    )
    what = parser.parse_args(argv).what
    if what == "json":
        print(json.dumps(policies(), indent=1))
    else:
        names = {"names": registry.available, "in-lerobot": in_lerobot, "lerobot-extras": lerobot_extras}
        print(",".join(names[what]()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
