#!/usr/bin/env bash
# LeRobot interop checks for CI: build (or reuse) LeRobot 0.6.1's own environment from this machine's
# Python 3.12, then run lerobot-parallel's, lerobot-ckpt's and lerobot-trainloop's own tests on its torch
# and every policy's round trip against it (tools/interop/*_lerobot_interop.py).
#
# LeRobot is installed with the extras its classes of our policies need, read from our policy registry
# (each spec's lerobot_extras: [pi] for pi0/pi05, [diffusion], [smolvla], [fastwam] …; python -m
# lerobot_cli.policies.manifest lerobot-extras), so a new policy brings its extra without an edit here, plus
# [dataset] (LeRobotDataset, which examples/lerobot_act_fsdp.py trains on).
#
# The environment is cached between runs in $LEROBOT_INTEROP_VENV (default ~/.cache/lerobot-interop/
# lerobot-0.6.1-py312, ~5 GB) and rebuilt only when it does not import LeRobot 0.6.1 with peft, or its
# transformers is 5.6 or newer (pi0/pi05 need the [pi] extra's, below). An env that lacks a requirement of
# one of those extras (a new policy's) has the extras installed into it, not rebuilt. No Python 3.12 means
# no interop run: that is said in one line and fails, so a missing run is never read as a pass.
set -euo pipefail
cd "$(dirname "$0")/../.."

LEROBOT_VERSION="0.6.1"
PEFT_VERSION="0.21.2"   # what lerobot-cli's lock pins, so both sides read the same adapter files
VENV="${LEROBOT_INTEROP_VENV:-$HOME/.cache/lerobot-interop/lerobot-${LEROBOT_VERSION}-py312}"
policy_extras="$(uv run --frozen python -m lerobot_cli.policies.manifest lerobot-extras)" || {
  echo "interop: FAILED: our policy registry did not list LeRobot's extras (python -m lerobot_cli.policies.manifest)" >&2
  exit 1
}
# pusht: pusht_eval_lerobot_interop.py runs LeRobot's own PushT evaluation
LEROBOT_EXTRAS="${policy_extras:+${policy_extras},}dataset,pusht"

find_python312() {
  local candidate
  for candidate in "${LEROBOT_INTEROP_PYTHON:-}" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 \
      /usr/bin/python3.12 /usr/local/bin/python3.12; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      "$candidate" -c 'import sys; print(sys.executable)'
      return 0
    fi
  done
  return 1
}

env_ok() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$LEROBOT_VERSION" "$PEFT_VERSION" "$LEROBOT_EXTRAS" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, metadata, requires, version

from packaging.requirements import Requirement


def missing(extra: str) -> list[str]:
    """The distributions lerobot[extra] requires on this machine that are not installed (nested extras too)."""
    out = []
    for line in requires("lerobot") or []:
        req = Requirement(line)
        if req.marker is None or not req.marker.evaluate({"extra": extra}):
            continue
        if req.name == "lerobot":  # lerobot[transformers-dep] and the like: its own extras
            out += [name for nested in sorted(req.extras) for name in missing(nested)]
            continue
        try:
            version(req.name)
        except PackageNotFoundError:
            out.append(f"{req.name} (lerobot[{extra}])")
    return out


try:
    assert version("lerobot") == sys.argv[1] and version("peft") == sys.argv[2]
except (PackageNotFoundError, AssertionError):
    sys.exit(1)
unknown = set(sys.argv[3].split(",")) - set(metadata("lerobot").get_all("Provides-Extra") or [])
if unknown:
    print(f"interop: LeRobot {sys.argv[1]} has no extras {sorted(unknown)} (a spec's lerobot_extras)", file=sys.stderr)
    sys.exit(4)
absent = [name for extra in sys.argv[3].split(",") for name in missing(extra)]
if absent:
    print(f"interop: LeRobot's env lacks {', '.join(absent)}", file=sys.stderr)
    sys.exit(3)
# transformers from the [pi] extra (>= 5.4, < 5.6): a newer one pi0 cannot use
try:
    sys.exit(tuple(int(part) for part in version("transformers").split(".")[:2]) >= (5, 6))
except PackageNotFoundError:
    pass  # no extra asked for it (their requirements are checked above)
EOF
}

# env_ok's status: 0 ready; 3 LeRobot and peft right, an extra's requirement missing (installed into it:
# a new policy's extra does not cost a rebuild); 4 an extra LeRobot lacks (a wrong lerobot_extras); else
# rebuilt from scratch.
ok=0
env_ok || ok=$?
if [ "$ok" = 4 ]; then
  echo "interop: FAILED: LeRobot ${LEROBOT_VERSION} has not all of the extras [${LEROBOT_EXTRAS}]" >&2
  exit 1
elif [ "$ok" = 3 ]; then
  echo "interop: adding lerobot[${LEROBOT_EXTRAS}] to ${VENV}"
  uv pip install -q --python "$VENV/bin/python" "lerobot[${LEROBOT_EXTRAS}]==${LEROBOT_VERSION}" "peft==${PEFT_VERSION}"
  env_ok || { echo "interop: FAILED: ${VENV} does not import lerobot[${LEROBOT_EXTRAS}] ${LEROBOT_VERSION} with peft ${PEFT_VERSION}" >&2; exit 1; }
elif [ "$ok" != 0 ]; then
  if ! PY312="$(find_python312)"; then
    echo "interop: FAILED: no Python 3.12 on this machine (LeRobot ${LEROBOT_VERSION} needs it; set LEROBOT_INTEROP_PYTHON), so LeRobot cannot check our checkpoints" >&2
    exit 1
  fi
  echo "interop: building LeRobot ${LEROBOT_VERSION} in ${VENV} from ${PY312}"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  uv venv -q --python "$PY312" "$VENV"
  uv pip install -q --python "$VENV/bin/python" "lerobot[${LEROBOT_EXTRAS}]==${LEROBOT_VERSION}" "peft==${PEFT_VERSION}"
  env_ok || { echo "interop: FAILED: ${VENV} does not import lerobot[${LEROBOT_EXTRAS}] ${LEROBOT_VERSION} (transformers < 5.6) with peft ${PEFT_VERSION}" >&2; exit 1; }
else
  echo "interop: reusing LeRobot ${LEROBOT_VERSION}[${LEROBOT_EXTRAS}] in ${VENV}"
fi

status=0
# The libraries on the torch their users have: lerobot-parallel, lerobot-ckpt[torch] and lerobot-trainloop
# declare torch >= 2.11 (LeRobot's); their own tests run here on LeRobot's torch, which is pinned so that
# installing them cannot move it.
lerobot_torch="$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("torch"))')"
echo "interop: the libraries' tests on LeRobot's torch ${lerobot_torch}"
if uv pip install -q --python "$VENV/bin/python" --constraint <(echo "torch==${lerobot_torch}") pytest \
      -e packages/lerobot-parallel -e "packages/lerobot-ckpt[torch]" -e packages/lerobot-trainloop \
    && "$VENV/bin/python" -m pytest -q -p no:cacheprovider --import-mode=importlib \
      -o tmp_path_retention_policy=failed -o tmp_path_retention_count=1 \
      packages/lerobot-parallel/tests packages/lerobot-ckpt/tests packages/lerobot-trainloop/tests; then
  echo "interop: libraries on torch ${lerobot_torch}: PASS"
else
  echo "interop: FAILED: the libraries' tests on LeRobot's torch ${lerobot_torch}" >&2
  status=1
fi
# Each driver writes its checkpoints and datasets (up to ~0.5 GB) under its own scratch TMPDIR, removed
# after it whatever it left: the disk is shared, and sixteen drivers' leftovers filled it once.
for check in tools/interop/*_lerobot_interop.py; do
  echo "interop: $(basename "$check")"
  scratch="$(mktemp -d)"
  if ! TMPDIR="$scratch" uv run --frozen python "$check" --lerobot-python "$VENV/bin/python"; then
    echo "interop: FAILED: $(basename "$check")" >&2
    status=1
  fi
  rm -rf "$scratch"
done
exit "$status"
