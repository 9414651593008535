#!/usr/bin/env bash
# moejax entry point.
#
#   ./launch.sh [CONFIG_FILE] [--workdir DIR] [--config.key=value ...]
#       Train. With no arguments: experiments/tiny_moe.py into runs/tiny_moe.
#       Rerunning the same command resumes from the latest checkpoint in DIR.
#   ./launch.sh test [pytest arguments]
#       Run the test suite (CPU, 8 fake devices).
#
# Python: $MOEJAX_PYTHON if set (e.g. an environment with jax[cuda] or jax[tpu]); otherwise
# ./.venv, created and filled from requirements.txt on first use (and refreshed when that file
# changes).
#
# Multi-host: run the same command on every host with JAX_COORDINATOR_ADDRESS=host0:port,
# JAX_NUM_PROCESSES=N and JAX_PROCESS_ID=i (or MOEJAX_DISTRIBUTED=1 on TPU pods / SLURM).
set -euo pipefail
cd "$(dirname "$0")"

python_env() {
  if [[ -n "${MOEJAX_PYTHON:-}" ]]; then
    PY="$MOEJAX_PYTHON"
    return
  fi
  local stamp=.venv/.requirements.sha256
  local want
  want=$(sha256sum requirements.txt | cut -d' ' -f1)
  if [[ ! -x .venv/bin/python || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    echo "launch.sh: installing requirements into .venv (first run only)..." >&2
    python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -r requirements.txt
    echo "$want" > "$stamp"
  fi
  PY=.venv/bin/python
}

python_env
if [[ "${1:-}" == "test" ]]; then
  shift
  exec "$PY" -m pytest -q "$@"
fi

config=experiments/tiny_moe.py
if [[ $# -gt 0 && "$1" != --* ]]; then
  config=$1
  shift
fi
if [[ ! -f "$config" ]]; then
  echo "launch.sh: config file '$config' not found; experiments/ has: $(ls experiments/*.py | tr '\n' ' ')" >&2
  exit 2
fi
workdir_given=0
for arg in "$@"; do [[ "$arg" == --workdir* ]] && workdir_given=1; done
extra=()
if [[ $workdir_given == 0 ]]; then
  extra=(--workdir "runs/$(basename "$config" .py)")
fi
exec "$PY" -m moejax.main --config "$config" "${extra[@]}" "$@"
