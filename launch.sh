#!/usr/bin/env bash
# moejax entry point.
#
#   ./launch.sh [CONFIG_FILE] [--workdir DIR] [--config.key=value ...]
#       Train. With no arguments: experiments/tiny_moe.py into runs/tiny_moe.
#       Rerunning the same command resumes from the latest checkpoint in DIR.
#   ./launch.sh test [pytest arguments]
#       Run the test suite (CPU, 8 fake devices, 2 pytest-xdist workers; MOEJAX_TEST_WORKERS=0
#       for one process). Slow drills are left out; add -m slow to run them.
#   ./launch.sh python [arguments]
#       Any other command in the same environment, e.g. ./launch.sh python -m moejax.eval --workdir DIR
#
# Every process started here runs with mimalloc preloaded (LD_PRELOAD): XLA:CPU takes a fresh
# buffer for each step's temporaries, which glibc's malloc maps and unmaps every step, so the step
# page-faults it all back in; mimalloc reuses it (CPU steps 1.2-1.3x faster; moejax/allocator.py).
# MOEJAX_ALLOCATOR=system keeps the system allocator.
#
# Python: $MOEJAX_PYTHON if set (e.g. an environment with jax[cuda] or jax[tpu]); otherwise
# ./.venv, created and filled from requirements.txt on first use (and refreshed when that file
# changes).
#
# Multi-host (docs/multihost.md): run the same command on every host, one process per host, with
# JAX_COORDINATOR_ADDRESS=host0:port, JAX_NUM_PROCESSES=N and JAX_PROCESS_ID=i set on host i (or
# MOEJAX_DISTRIBUTED=1 on TPU pods and under SLURM, where JAX finds them itself). The workdir
# must be on a filesystem every host sees. To try it on one machine:
#   MOEJAX_LOCAL_PROCESSES=2 JAX_NUM_CPU_DEVICES=4 ./launch.sh CONFIG --workdir DIR
# starts 2 processes on localhost (CPU, 4 devices each) with those variables set.
#
# Paths: every command runs from this repository (its .venv, experiments/ and the default runs/
# live here), and relative paths given to it mean what they mean where you ran it:
# MOEJAX_CALLER_CWD tells the Python side (moejax/paths.py) where that was. A config file is
# looked up there first, then in the repository (experiments/tiny_moe.py works from anywhere).
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")"

python_env() {
  if [[ -n "${MOEJAX_PYTHON:-}" ]]; then
    PY="$MOEJAX_PYTHON"
    return
  fi
  local stamp=.venv/.requirements.sha256
  local want
  want=$(sha256sum requirements.txt | cut -d' ' -f1)
  # Hosts of a multi-host job sharing this checkout start together: one installs, the others wait.
  mkdir -p .venv
  exec 9> .venv/.install.lock
  if command -v flock > /dev/null; then flock 9; fi
  if [[ ! -x .venv/bin/python || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    echo "launch.sh: installing requirements into .venv (first run only)..." >&2
    python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -r requirements.txt
    echo "$want" > "$stamp"
  fi
  exec 9>&-
  PY=.venv/bin/python
}

use_mimalloc() {
  local lib
  lib=$("$PY" -m moejax.allocator) || exit 2
  if [[ -n "$lib" && ":${LD_PRELOAD:-}:" != *":$lib:"* ]]; then
    export LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}"
  fi
  # Keep freed memory for good: with mimalloc's default 10 ms purge delay the host work between
  # two steps of the loop was enough to give the buffer back (loop steps x1.08 without purging).
  [[ -n "$lib" ]] && export MIMALLOC_PURGE_DELAY="${MIMALLOC_PURGE_DELAY:--1}"
  return 0
}

python_env
use_mimalloc
if [[ "${1:-}" == "python" ]]; then
  shift
  MOEJAX_CALLER_CWD=$caller exec "$PY" "$@"
fi
if [[ "${1:-}" == "test" ]]; then
  shift
  # Two pytest-xdist workers by default (XLA compiles are mostly single-threaded, so one process
  # leaves a core idle); whole files go to one worker, so module fixtures are built once.
  # MOEJAX_TEST_WORKERS=0 runs everything in this process (e.g. for --pdb); -n N overrides.
  workers=()
  if [[ " $* " != *" -n "* && " $* " != *" --numprocesses"* && " $* " != *" -n"[0-9a]* ]]; then
    workers=(-n "${MOEJAX_TEST_WORKERS:-2}" --dist loadfile)
  fi
  exec "$PY" -m pytest -q ${workers[@]+"${workers[@]}"} "$@"
fi

config=experiments/tiny_moe.py
if [[ $# -gt 0 && "$1" != --* ]]; then
  config=$1
  shift
fi
here=$PWD
if [[ "$caller" != "$here" && "$config" != /* && -f "$caller/$config" ]]; then
  config="$caller/$config"
fi
if [[ ! -f "$config" ]]; then
  echo "launch.sh: error: config file '$config' not found (looked in $caller and in $here); experiments/ has: $(ls experiments/*.py | tr '\n' ' ')" >&2
  exit 2
fi
workdir_given=0
for arg in "$@"; do [[ "$arg" == --workdir* ]] && workdir_given=1; done
extra=()
if [[ $workdir_given == 0 ]]; then  # the default workdir is in the repository, wherever you are
  workdir="runs/$(basename "$config" .py)"
  [[ "$caller" != "$here" ]] && workdir="$here/$workdir"
  extra=(--workdir "$workdir")
fi
MOEJAX_CALLER_CWD=$caller exec "$PY" -m moejax.main --config "$config" "${extra[@]}" "$@"
