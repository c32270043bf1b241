"""``lerobot-eval <flags>`` on every rank of a launch: ``lerobot_cli.eval.main``, the console script's own
entry point (a runner, because the module run as a file would put ``lerobot_cli/`` first on ``sys.path``,
where its ``datasets``/``peft`` folders hide the packages of those names)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arm_watchdog

arm_watchdog(float(os.environ.get("LEROBOT_EVAL_WATCHDOG_S", "120")))

from lerobot_cli.eval import main

raise SystemExit(main(sys.argv[1:]))
