#!/usr/bin/env bash
# LeRobot interop checks for CI: build (or reuse) LeRobot 0.6.1's own environment from this machine's
# Python 3.12, then run lerobot-parallel's, lerobot-ckpt's and lerobot-trainloop's own tests on its torch
# and every policy's round trip against it (tools/interop/*_lerobot_interop.py).
#
# The environment is cached between runs in $LEROBOT_INTEROP_VENV (default ~/.cache/lerobot-interop/
# lerobot-0.6.1-py312, ~5 GB) and rebuilt only when it does not import LeRobot 0.6.1 with peft, the
# transformers of its [pi] extra (< 5.6, which pi0/pi05 need; an env without the extra is rebuilt) and the
# diffusers of its [diffusion] extra (LeRobot's DiffusionPolicy refuses to build without it; [fastwam] names the
# same transformers and diffusers, for FastWAM's Wan2.2 VAE and UMT5) and the datasets
# of its [dataset] extra (LeRobotDataset, which examples/lerobot_act_fsdp.py trains on). No
# Python 3.12 means no interop run: that is said in one line and fails, so a missing run is never read
# as a pass.
set -euo pipefail
cd "$(dirname "$0")/../.."

LEROBOT_VERSION="0.6.1"
PEFT_VERSION="0.21.2"   # what lerobot-cli's lock pins, so both sides read the same adapter files
VENV="${LEROBOT_INTEROP_VENV:-$HOME/.cache/lerobot-interop/lerobot-${LEROBOT_VERSION}-py312}"

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
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$LEROBOT_VERSION" "$PEFT_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
assert version("lerobot") == sys.argv[1] and version("peft") == sys.argv[2]
# transformers from the [pi] extra (>= 5.4, < 5.6): without it there is none, or a newer one pi0 cannot use
assert tuple(int(part) for part in version("transformers").split(".")[:2]) < (5, 6)
version("diffusers")  # the [diffusion] extra
version("datasets")  # the [dataset] extra: LeRobotDataset, for examples/lerobot_act_fsdp.py
EOF
}

if ! env_ok; then
  if ! PY312="$(find_python312)"; then
    echo "interop: FAILED: no Python 3.12 on this machine (LeRobot ${LEROBOT_VERSION} needs it; set LEROBOT_INTEROP_PYTHON), so LeRobot cannot check our checkpoints" >&2
    exit 1
  fi
  echo "interop: building LeRobot ${LEROBOT_VERSION} in ${VENV} from ${PY312}"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  uv venv -q --python "$PY312" "$VENV"
  uv pip install -q --python "$VENV/bin/python" "lerobot[pi,diffusion,dataset,fastwam,pusht]==${LEROBOT_VERSION}" "peft==${PEFT_VERSION}"
  env_ok || { echo "interop: FAILED: ${VENV} does not import lerobot[pi,diffusion,dataset,fastwam] ${LEROBOT_VERSION} (transformers < 5.6, diffusers) with peft ${PEFT_VERSION}" >&2; exit 1; }
else
  echo "interop: reusing LeRobot ${LEROBOT_VERSION} in ${VENV}"
fi

# gym-pusht for pusht_eval_lerobot_interop.py (LeRobot's [pusht] extra), added to an env built before it
# was needed rather than rebuilding the whole env
if ! "$VENV/bin/python" -c 'import gym_pusht' 2>/dev/null; then
  echo "interop: adding lerobot[pusht] ${LEROBOT_VERSION} to ${VENV}"
  uv pip install -q --python "$VENV/bin/python" "lerobot[pusht]==${LEROBOT_VERSION}"
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
