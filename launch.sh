#!/usr/bin/env bash
# moejax entry point.
#
#   ./launch.sh [CONFIG_FILE] [--workdir DIR] [--config.key=value ...] [-q | -v]
#       Train. With no arguments: experiments/configs/tiny_moe.py into runs/tiny_moe. -q/--quiet: only
#       warnings, errors and the final line; -v/--verbose: debug messages too.
#       Rerunning the same command resumes from the latest checkpoint in DIR.
#   ./launch.sh test [pytest arguments]
#       Run the test suite (CPU, 8 fake devices, 2 pytest-xdist workers; MOEJAX_TEST_WORKERS=0
#       for one process). Slow drills are left out; add -m slow to run them.
#   ./launch.sh python [arguments]
#       Any other command in the same environment, e.g. ./launch.sh python -m moejax.eval --workdir DIR;
#       ./launch.sh python my_script.py runs my_script.py of the directory you are in.
#   ./launch.sh gpu-check [--out FILE] [--venv DIR]
#       On an NVIDIA GPU machine: makes DIR (default .venv-gpu) with $MOEJAX_BASE_PYTHON (default python3)
#       and the pinned jax[cuda12] plus tokamax, unless it exists (with MOEJAX_PYTHON set, that environment
#       is used instead), then runs MFU (dense; MoE at 8, 64, 128 experts, ragged_dot and tokamax), LLEP and
#       the peer step into one JSON (default results/gpu_check.json) and prints a table
#       (experiments/benchmarks/gpu_check.py; docs/performance.md). --smoke: the same code path at tiny
#       sizes on this machine's CPU, in ./.venv (no install).
#
# Every process started here runs with mimalloc preloaded (LD_PRELOAD): XLA:CPU takes a fresh
# buffer for each step's temporaries, which glibc's malloc maps and unmaps every step, so the step
# page-faults it all back in; mimalloc reuses it (faster CPU steps, same numbers; moejax/allocator.py,
# measured in experiments/benchmarks/LOG.md, change 6).
# MOEJAX_ALLOCATOR=system keeps the system allocator.
#
# Python: $MOEJAX_PYTHON if set (e.g. an environment with jax[cuda] or jax[tpu]), checked before
# every command against the pins (moejax/envcheck.py: the base requirements, and the dev extra's
# for `test`; MOEJAX_CHECK_PINS=warn runs anyway, =0 skips the check). Otherwise ./.venv, made on
# first use with $MOEJAX_BASE_PYTHON (default python3, 3.11 or newer) and filled with
#   pip install -c constraints.txt -e ".[$MOEJAX_EXTRAS]"
# MOEJAX_EXTRAS: by default none for training and other commands (the light base: training,
# evaluation, the mixture laws, local sweeps; no torch, Ray or pytest) and dev for `test` (what the
# suite needs); a .venv keeps what it has (a dev .venv stays dev), and `test` adds dev to a light one.
# (Refreshed when pyproject.toml, constraints.txt or the extras change.) torch (the hf extra,
# which dev includes) comes from the CPU-only wheel index, $MOEJAX_TORCH_INDEX (default
# https://download.pytorch.org/whl/cpu; empty: PyPI's build, which is CUDA's on Linux x86_64);
# when that index cannot be reached, pip takes torch from where it finds it, with a note.
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
# looked up there first, then in the repository (experiments/configs/tiny_moe.py works from
# anywhere). The configs' old paths (experiments/tiny_moe.py, before they moved to
# experiments/configs/) still work, with a one-line note naming the new path.
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")"

MIN_PYTHON=3.11  # pyproject.toml's requires-python (jax 0.10 needs it)

# Exits with a clear message unless Python "$1" runs and is MIN_PYTHON or newer; "$2" names it.
check_python() {
  local version
  if ! version=$("$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null); then
    echo "launch.sh: error: $2 ($1) does not run; give a Python $MIN_PYTHON or newer." >&2
    exit 2
  fi
  if ! "$1" -c "import sys; sys.exit(sys.version_info[:2] < tuple(map(int, '$MIN_PYTHON'.split('.'))))" 2>/dev/null; then
    echo "launch.sh: error: moejax needs Python $MIN_PYTHON or newer (jax 0.10 does); $2 ($1) is Python $version." \
      "Install a newer Python and set MOEJAX_BASE_PYTHON=/path/to/python3.11 (the Python ./.venv is made with)," \
      "or MOEJAX_PYTHON=/path/to/python of an environment that has moejax's packages." >&2
    exit 2
  fi
}

# Checks that Python "$1"'s environment has the packages pinned in constraints.txt (see the top).
check_pins() {
  local py=$1 label=$2 extras=$3 purpose=$4
  [[ "${MOEJAX_CHECK_PINS:-1}" == 0 ]] && return 0
  if ! "$py" -P moejax/envcheck.py check --extras "$extras" --label "$label" --purpose "$purpose"; then
    [[ "${MOEJAX_CHECK_PINS:-1}" == warn ]] || exit 2
    echo "launch.sh: MOEJAX_CHECK_PINS=warn: running anyway." >&2
  fi
}

# Does the CPU-only wheel index answer? (A short probe: pip would retry an unreachable index.)
torch_index_reachable() {
  "$1" - "$2" <<'PY' 2> /dev/null
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10).close()
PY
}

python_env() {
  local purpose=$1
  if [[ -n "${MOEJAX_PYTHON:-}" ]]; then
    PY="$MOEJAX_PYTHON"
    check_python "$PY" "MOEJAX_PYTHON"
    if [[ "$purpose" == test ]]; then
      check_pins "$PY" "the environment of MOEJAX_PYTHON" dev "the test suite"
    else
      check_pins "$PY" "the environment of MOEJAX_PYTHON" "" ""
    fi
    return
  fi
  # Which extras: MOEJAX_EXTRAS when set; else `test` needs the dev extra, and anything else keeps
  # what ./.venv has (the light base, no extras, when there is no ./.venv yet): the first training
  # run installs only what training needs, and `./launch.sh test` adds the test extra once.
  local installed="" base=${MOEJAX_BASE_PYTHON:-python3} candidate
  if [[ -f .venv/.install.extras ]]; then
    installed=$(cat .venv/.install.extras)
  elif [[ -f .venv/.install.sha256 ]]; then  # a .venv made before the extras were recorded
    for candidate in dev ""; do
      [[ "$(cat .venv/.install.sha256)" == "$( (cat pyproject.toml constraints.txt; echo "extras=$candidate") | sha256sum | cut -d' ' -f1)" ]] \
        && installed=$candidate && break
    done
  fi
  local extras=$installed
  [[ "$purpose" == test ]] && extras=dev
  extras=${MOEJAX_EXTRAS-$extras}
  local stamp=.venv/.install.sha256 want
  want=$( (cat pyproject.toml constraints.txt; echo "extras=$extras") | sha256sum | cut -d' ' -f1)
  # Hosts of a multi-host job sharing this checkout start together: one installs, the others wait.
  mkdir -p .venv
  exec 9> .venv/.install.lock
  if command -v flock > /dev/null; then flock 9; fi
  if [[ ! -x .venv/bin/python || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    local label=python3
    [[ -n "${MOEJAX_BASE_PYTHON:-}" ]] && label=MOEJAX_BASE_PYTHON
    check_python "$base" "$label"
    echo "launch.sh: installing moejax${extras:+[$extras]} into .venv from the pins in constraints.txt (first run only)..." >&2
    if ! "$base" -m venv .venv; then
      echo "launch.sh: error: '$base -m venv .venv' failed; on Debian/Ubuntu install the python3-venv package" \
        "(apt install python3-venv), or set MOEJAX_BASE_PYTHON to a Python that has venv." >&2
      exit 2
    fi
    local pip=(.venv/bin/python -m pip install --quiet -c constraints.txt)
    "${pip[@]}" --upgrade pip
    local spec=.
    [[ -n "$extras" ]] && spec=".[$extras]"
    if .venv/bin/python -P moejax/envcheck.py list --extras "$extras" | grep -qx torch; then
      local index=${MOEJAX_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
      if [[ -n "$index" ]] && torch_index_reachable .venv/bin/python "$index"; then
        # torch alone first, from the CPU-only index (2.13.0+cpu meets the pin torch==2.13.0).
        "${pip[@]}" --extra-index-url "$index" torch
      elif [[ -n "$index" ]]; then
        echo "launch.sh: note: the CPU-only wheel index $index does not answer; torch comes from pip's" \
          "usual sources (on Linux x86_64, PyPI's torch is the CUDA build, several GB, unless pip is pointed" \
          "at a CPU wheel, e.g. by --find-links in its config). MOEJAX_TORCH_INDEX=URL names another index." >&2
      fi
    fi
    "${pip[@]}" -e "$spec"
    check_pins .venv/bin/python ".venv" "$extras" ""
    echo "$extras" > .venv/.install.extras
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
  # two steps of the loop was enough to give the buffer back (slower loop steps; measured in
  # experiments/benchmarks/LOG.md, change 6).
  [[ -n "$lib" ]] && export MIMALLOC_PURGE_DELAY="${MIMALLOC_PURGE_DELAY:--1}"
  return 0
}

if [[ "${1:-}" == "gpu-check" ]]; then
  shift
  if [[ " $* " != *" --smoke "* ]]; then  # the GPU run: its own environment, made by gpu_check.py
    if [[ -n "${MOEJAX_PYTHON:-}" ]]; then
      check_python "$MOEJAX_PYTHON" "MOEJAX_PYTHON"
      MOEJAX_CALLER_CWD=$caller exec "$MOEJAX_PYTHON" -m experiments.benchmarks.gpu_check --in-env "$@"
    fi
    base=${MOEJAX_BASE_PYTHON:-python3} label=python3
    [[ -n "${MOEJAX_BASE_PYTHON:-}" ]] && label=MOEJAX_BASE_PYTHON
    check_python "$base" "$label"
    MOEJAX_CALLER_CWD=$caller exec "$base" experiments/benchmarks/gpu_check.py "$@"
  fi
  python_env ""
  use_mimalloc
  MOEJAX_CALLER_CWD=$caller exec "$PY" -m experiments.benchmarks.gpu_check "$@"
fi

python_env "${1:-}"
use_mimalloc
if [[ "${1:-}" == "python" ]]; then
  shift
  # A relative script path means the user's directory, as every other path does (the repository's
  # when only it has the file, so experiments/... works from anywhere).
  if [[ $# -gt 0 && "$1" != -* && "$1" != /* && "$caller" != "$PWD" ]] \
      && [[ -f "$caller/$1" || ! -e "$1" ]]; then
    set -- "$caller/$1" "${@:2}"
  fi
  MOEJAX_CALLER_CWD=$caller exec "$PY" "$@"
fi
if [[ "${1:-}" == "test" ]]; then
  shift
  # Two pytest-xdist workers by default (XLA compiles are mostly single-threaded, so one process
  # leaves a core idle); whole files go to one worker, so module fixtures are built once.
  # MOEJAX_TEST_WORKERS=0 runs everything in this process (e.g. for --pdb); -n N overrides.
  # A crashed worker is not replaced (--max-worker-restart=0): its tests fail and the run ends
  # instead of the controller waiting on a replacement.
  workers=()
  if [[ " $* " != *" -n "* && " $* " != *" --numprocesses"* && " $* " != *" -n"[0-9a]* ]]; then
    workers=(-n "${MOEJAX_TEST_WORKERS:-2}" --dist loadfile --max-worker-restart=0)
  fi
  exec "$PY" -m pytest -q ${workers[@]+"${workers[@]}"} "$@"
fi

config=experiments/configs/tiny_moe.py
if [[ $# -gt 0 && "$1" != -* ]]; then  # -q, -v and --options go to moejax.main
  config=$1
  shift
fi
here=$PWD
if [[ "$caller" != "$here" && "$config" != /* && -f "$caller/$config" ]]; then
  config="$caller/$config"
fi
if [[ ! -f "$config" && "$config" =~ ^(\./)?experiments/([a-z0-9_]+\.py)$ && -f "experiments/configs/${BASH_REMATCH[2]}" ]]; then
  echo "launch.sh: note: $config is now experiments/configs/${BASH_REMATCH[2]} (the old path still works)" >&2
  config="experiments/configs/${BASH_REMATCH[2]}"
fi
if [[ ! -f "$config" ]]; then
  echo "launch.sh: error: config file '$config' not found (looked in $caller and in $here); experiments/configs/ has: $(ls experiments/configs/[!_]*.py | tr '\n' ' ')" >&2
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
