"""The sweep's scheduling loop: plan -> finished, evaluated runs -> ``ROOT/runs.csv``.

For every target of the plan (``targets.py``), in plan order, with at most ``parallel`` attempts
in flight:

1. **Skip** a target that is done on disk (final checkpoint + an ``eval/step_N.json`` for every
   checkpoint, :func:`record.run_progress`), whoever made it: nothing is relaunched.
2. **Lease** it (``record.try_acquire``). A target whose lease another live runner holds is left
   to that runner (reported as "elsewhere"; with ``wait_others`` it is polled until it is done or
   its lease goes stale, then taken over). Several runners, on one machine or on many, against
   one root, therefore never run one target twice.
3. **Launch** an attempt through the backend (local threads or Ray tasks); the attempt trains (moejax
   resumes from the latest checkpoint in the run directory) and evaluates (``attempt.py``).
   While it runs, the runner touches its lease and rewrites its status every ``heartbeat``
   seconds.
4. **Retry** a failed attempt up to ``retries`` more times in this invocation (it resumes from its
   checkpoints like any restart), then report it with the path of its log; the other targets go
   on. A restarted sweep tries failed targets again (a fresh retry budget), so a fix is picked up
   by rerunning the same command.
   A mid-training target (``base`` in its plan entry) is launched only once its base is done
   (trained and evaluated, on disk): until then it waits in the queue while the base (earlier in
   plan order) runs, under this runner or another (the base's lease makes sure it is trained
   once). When the base has failed (after its retries) its mid-training targets are **blocked**:
   not launched, reported with the base's failure, and the sweep exits 1. A base leased by another
   runner that this one does not wait for (no ``wait_others``) leaves its targets **waiting**,
   reported like the base itself: rerun (or ``--wait-others``) once it is done.
5. **Collect** every finished target of the plan into ``ROOT/runs.csv`` (``data_mixture.collect``),
   written atomically.

Ctrl-C (or SIGTERM to the runner): no new launches; each running child gets one SIGTERM (moejax
saves a checkpoint and exits); the runner waits for them (a second Ctrl-C kills them), marks them
``interrupted``, releases their leases and exits 130 (143 for SIGTERM) with a one-line summary.
Rerunning the same command resumes them from those checkpoints.

Exit status of :func:`run_sweep`'s result: 0 every target is done (or running under another
runner), 1 a target failed (after its retries) or collect failed, 130/143 interrupted.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from data_mixture.sweep import record
from data_mixture.sweep.targets import RunTarget, SweepError, launch_command, load_plan, targets_from_plan

log = logging.getLogger(__name__)

# Environment variables handed to every run explicitly (Ray workers do not inherit the driver's
# environment); the local backend's children inherit the whole environment anyway. LD_PRELOAD
# carries launch.sh's allocator (moejax/allocator.py) to each run's training process.
ENV_PREFIXES = ("JAX_", "XLA_", "MOEJAX_", "TF_CPP_", "LD_PRELOAD")


@dataclasses.dataclass
class SweepOptions:
    root: str
    backend: str = "local"  # local | ray
    parallel: int | None = None  # attempts in flight (default: 1 local; Ray: the cluster's CPUs (GPUs) / per run)
    retries: int = 1  # extra attempts per target and invocation after a failure
    eval_args: Sequence[str] = ()  # passed to python -m moejax.eval --all
    lease_timeout: float = 300.0  # seconds without a heartbeat after which a lease is stale
    heartbeat: float = 30.0  # seconds between heartbeats
    grace: float = 120.0  # seconds a child has after SIGTERM before SIGKILL
    wait_others: bool = False  # wait for targets held by other runners (take over if stale)
    progress: bool = True
    ray_address: str | None = None
    cpus_per_run: float = 1.0
    gpus_per_run: float = 0.0
    ray_init_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. num_cpus for a local cluster
    python: str = sys.executable


@dataclasses.dataclass
class SweepResult:
    exit_code: int
    succeeded: list[str]  # done at the end (skipped ones included)
    skipped: list[str]  # already done when the sweep started (nothing launched)
    launched: list[str]  # targets with at least one attempt in this invocation
    failed: dict[str, dict[str, Any]]  # name -> last attempt's result (message, log)
    interrupted: list[str]
    elsewhere: dict[str, dict[str, Any]]  # name -> the other runner's lease
    runs_csv: str | None
    rows: int
    summary: str
    blocked: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> why (its base failed)
    waiting: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> its base, leased by another runner


def check_options(options: SweepOptions) -> None:
    if options.backend not in ("local", "ray"):
        raise SweepError(f"--backend {options.backend!r}; allowed: local | ray.")
    if options.parallel is not None and options.parallel < 1:
        raise SweepError(f"--parallel {options.parallel}; allowed: an integer >= 1 (attempts running at once).")
    if options.retries < 0:
        raise SweepError(f"--retries {options.retries}; allowed: an integer >= 0 (extra attempts after a failure).")
    if not options.heartbeat > 0 or not options.lease_timeout > options.heartbeat:
        raise SweepError(f"--heartbeat {options.heartbeat} and --lease-timeout {options.lease_timeout}; allowed: "
                         "heartbeat > 0 and a lease timeout longer than the heartbeat (several heartbeats, so that "
                         "a slow filesystem does not make a live lease look stale).")
    if options.cpus_per_run < 0 or options.gpus_per_run < 0:
        raise SweepError(f"--cpus-per-run {options.cpus_per_run}, --gpus-per-run {options.gpus_per_run}; allowed: >= 0.")
    if options.backend == "local" and (options.ray_address or options.gpus_per_run):
        raise SweepError("--ray-address and --gpus-per-run are for --backend ray; the local backend runs each child "
                         "with this machine's devices (use --parallel 1 on a GPU machine, or --backend ray).")


def check_records(targets: Sequence[RunTarget]) -> None:
    """A run directory made from a different plan entry must not be resumed or skipped as this one."""
    for t in targets:
        rec = record.read_json(t.run_dir / record.RECORD)
        if rec is None:
            continue
        if record.record_key(rec.get("config_file", ""), rec.get("overrides", {})) != record.record_key(
                t.config_file, t.overrides):
            old = rec.get("overrides", {})
            diff = sorted(k for k in set(old) | set(t.overrides) if old.get(k) != t.overrides.get(k))
            what = (f"override {diff[0]!r} was {old.get(diff[0])!r}, the plan now says {t.overrides.get(diff[0])!r}"
                    if diff else f"experiment file was {rec.get('config_file')!r}, the plan now says {t.config_file!r}")
            raise SweepError(f"run {t.name!r}: {t.run_dir} was made from a different plan entry ({what}; see its "
                             f"record.json). Use a new --root for the new plan, or delete {t.run_dir} to retrain it.")


def _job_env(root: Path) -> dict[str, str]:
    """The runs' environment variables; with a persistent compilation cache under ROOT unless the
    environment names one (``JAX_COMPILATION_CACHE_DIR``; set it empty to turn the cache off): every
    run of one size compiles the same train/eval steps, and a cache hit costs a fraction of a second
    where a compile costs seconds to minutes. JAX reads back the executable XLA compiled, so the
    numbers are the same with or without it."""
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        env["JAX_COMPILATION_CACHE_DIR"] = str(root / "xla_cache")
    return env


class _Display:
    """tqdm bar (done/total) with running/failed/elsewhere counts and an ETA; each message to ROOT/sweep.log
    and the log (INFO, or WARNING for what went wrong)."""

    def __init__(self, total: int, initial: int, log_path: Path, enabled: bool, slots: int):
        from tqdm import tqdm

        self.log_path, self.slots = log_path, slots
        self.bar = tqdm(total=total, initial=initial, desc="sweep", unit="run", disable=not enabled, file=sys.stderr,
                        bar_format="{desc}: {n_fmt}/{total_fmt} done |{bar}| {elapsed}{postfix}", dynamic_ncols=True)

    def say(self, message: str, level: int = logging.INFO) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        log.log(level, line)

    def update(self, done: int, running: dict[str, float], failed: int, elsewhere: int, waiting: int,
               durations: list[float]) -> None:
        self.bar.n = done
        eta = "?"
        if durations:
            mean = sum(durations) / len(durations)
            now = time.time()
            left = waiting * mean + sum(max(0.0, mean - (now - t0)) for t0 in running.values())
            eta = _fmt_seconds(left / max(1, min(self.slots, waiting + len(running)) or 1))
        self.bar.set_postfix_str(f"running {len(running)}, failed {failed}, elsewhere {elsewhere}, "
                                 f"waiting {waiting}, eta {eta}", refresh=True)

    def close(self) -> None:
        self.bar.close()


def _fmt_seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class _NoBackend:
    slots = 1

    def describe(self) -> str:
        return "nothing to launch"

    def wait(self, timeout: float) -> list:
        return []

    def stop(self, key=None) -> None:
        pass

    kill = close = stop


def make_backend(options: SweepOptions):
    if options.backend == "ray":
        from data_mixture.sweep.ray_backend import RayBackend  # Ray is imported only here

        return RayBackend(address=options.ray_address, cpus_per_run=options.cpus_per_run,
                          gpus_per_run=options.gpus_per_run, parallel=options.parallel, init_kwargs=options.ray_init_kwargs)
    from data_mixture.sweep.local import LocalBackend

    return LocalBackend(options.parallel or 1)


def prepare(plan_path: str | os.PathLike, options: SweepOptions) -> tuple[dict[str, Any], list[RunTarget]]:
    """Every input check, before anything is launched: options, plan, entries, configs, run dirs."""
    check_options(options)
    plan = load_plan(plan_path)
    targets = targets_from_plan(plan, options.root, plan_name=str(plan_path))
    check_records(targets)
    return plan, targets


def run_sweep(plan_path: str | os.PathLike, options: SweepOptions) -> SweepResult:
    """Runs the plan into ``options.root`` (see the module docstring); ``SweepError`` on bad input."""
    plan, targets = prepare(plan_path, options)
    root = Path(options.root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    record.write_json_atomic(root / "plan.json", plan)
    owner = record.new_owner()
    version = record.code_version()
    eval_args = list(options.eval_args)
    by_name = {t.name: t for t in targets}
    skipped = [t.name for t in targets if record.run_progress(t.run_dir, t.steps)["done"]]
    queue = collections.deque(t.name for t in targets if t.name not in skipped)
    # No backend (no Ray cluster to start) when every run is done: a finished sweep reruns at once.
    backend = make_backend(options) if queue else _NoBackend()
    succeeded: list[str] = list(skipped)
    launched: list[str] = []
    failed: dict[str, dict[str, Any]] = {}
    interrupted: list[str] = []
    elsewhere: dict[str, dict[str, Any]] = {}
    gates = {"blocked": {}, "waiting": {}}  # mid-training targets not launched: name -> reason / base
    tries: collections.Counter = collections.Counter()
    running: dict[str, float] = {}  # name -> start time
    durations: list[float] = []
    display = _Display(len(targets), len(skipped), root / "sweep.log", options.progress, backend.slots)
    _announce(display, root, backend, skipped, [by_name[n] for n in queue], len(targets))
    stop, handlers = _count_signals()
    sent = {"stop": False, "kill": False}
    last_beat = time.time()
    last_poll_others = 0.0
    try:
        while True:
            _pass_on_signals(stop, sent, running, by_name, backend, display)
            if not stop["count"]:
                polled = _fill(queue, by_name, running, backend, owner, options, version, eval_args, elsewhere,
                               succeeded, tries, launched, display, time.time() - last_poll_others, failed, gates)
                if polled:
                    last_poll_others = time.time()
            if not running and (stop["count"] or not queue):
                break
            for name, result in backend.wait(timeout=0.5 if running else 1.0):
                t = by_name[name]
                t0 = running.pop(name)
                _finish(t, result, owner, bool(stop["count"]), options.retries, tries, queue, succeeded, failed,
                        interrupted, durations, display, t0)
            if running and time.time() - last_beat >= options.heartbeat:
                last_beat = time.time()
                _heartbeat(running, by_name, owner, backend, display)
            display.update(len(succeeded), running, len(failed), len(elsewhere), len(queue), durations)
    except BaseException:  # a bug in the loop: stop the children (they save) before going down
        if running:
            _stop_children(running, by_name, backend, options.grace)
        raise
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
        backend.close()
        display.close()
    elsewhere = {k: v for k, v in elsewhere.items() if k not in succeeded}
    if stop["count"]:
        summary = (f"sweep: interrupted ({signal.Signals(stop['signum']).name}): {len(succeeded)} done, "
                   f"{len(interrupted)} interrupted ({', '.join(interrupted) or 'none'}), {len(failed)} failed, "
                   f"{len(targets) - len(succeeded) - len(interrupted) - len(failed)} not started; rerun the same "
                   "command to resume.")
        log.warning(summary)
        return SweepResult(128 + stop["signum"], succeeded, skipped, launched, failed, interrupted, elsewhere, None, 0,
                           summary, gates["blocked"], gates["waiting"])
    blocked, waiting = gates["blocked"], {k: v for k, v in gates["waiting"].items() if k not in succeeded}
    runs_csv, rows, collect_error = _collect(root, [t for t in targets if t.name in succeeded], by_name,
                                             validation_only=plan.get("validation_only") or ())
    head = (f"sweep: {len(targets)} runs: {len(succeeded)} done ({len(skipped)} skipped as already done, "
            f"{len([n for n in launched if n in succeeded])} run now), {len(failed)} failed, "
            + (f"{len(blocked)} blocked by a failed base, " if blocked else "")
            + (f"{len(waiting)} waiting for a base of another runner, " if waiting else "")
            + f"{len(elsewhere)} running under another runner; " + (f"wrote {runs_csv} ({rows} rows)" if runs_csv else
                                                                   "no runs.csv (no finished run)"))
    lines = [head, *_outcome_lines(failed, tries, blocked, waiting, elsewhere, by_name, collect_error)]
    summary = _report(root, lines, logging.WARNING if failed or collect_error else logging.INFO)
    code = 1 if failed or blocked or collect_error else 0
    return SweepResult(code, succeeded, skipped, launched, failed, interrupted, elsewhere, runs_csv, rows, summary,
                       blocked, waiting)


def _report(root: Path, lines: list[str], level: int) -> str:
    """The summary ``lines`` appended to ROOT/sweep.log and logged at ``level``; the summary text."""
    summary = "\n".join(lines)
    with open(root / "sweep.log", "a", encoding="utf-8") as f:
        f.writelines(f"{time.strftime('%H:%M:%S')} {line}\n" for line in lines)
    log.log(level, summary)
    return summary


def _count_signals() -> tuple[dict[str, int], dict]:
    """SIGINT and SIGTERM counted (the first signal's number, how many came) instead of raising,
    when this is the main thread: the count, and the handlers replaced, to restore."""
    stop = {"signum": 0, "count": 0}

    def on_signal(signum, frame):
        stop["signum"] = stop["signum"] or signum
        stop["count"] += 1

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, on_signal)
    return stop, handlers


def _announce(display: _Display, root: Path, backend, skipped: list[str], queued: list[RunTarget], n_targets: int) -> None:
    """The sweep's first lines: its runs, backend and finished runs, and how one run trains."""
    display.say(f"sweep: {n_targets} runs in {root} ({backend.describe()}); {len(skipped)} already done"
                + (f": {', '.join(skipped[:6])}{' ...' if len(skipped) > 6 else ''}" if skipped else ""))
    if queued:  # what each run is, as a command the user can run by hand
        first = queued[0]
        display.say("sweep: each run trains as, e.g. " + launch_command(
            first.config_file, first.run_dir, {**first.overrides, **first.added_overrides}))


def _pass_on_signals(stop: dict[str, int], sent: dict[str, bool], running: dict[str, float],
                     by_name: dict[str, RunTarget], backend, display: _Display) -> None:
    """The first SIGINT/SIGTERM asks every running run to save and stop; a second kills them."""
    if stop["count"] and not sent["stop"]:
        sent["stop"] = True
        display.say(f"sweep: {signal.Signals(stop['signum']).name}: stopping {len(running)} running run(s) "
                    "(each saves a checkpoint; press Ctrl-C again to kill them)", logging.WARNING)
        for name in running:
            _write_stop(by_name[name], 1)
        backend.stop()
    if stop["count"] > 1 and not sent["kill"]:
        sent["kill"] = True
        for name in running:
            _write_stop(by_name[name], 2)
        backend.kill()


def _heartbeat(running: dict[str, float], by_name: dict[str, RunTarget], owner, backend, display: _Display) -> None:
    """Renews the lease of every running run (stopping one whose lease another runner took) and
    records its worker's phase in its status."""
    for name in list(running):
        t = by_name[name]
        if not record.heartbeat(t.run_dir, owner):
            display.say(f"sweep: {name}: lease lost to another runner (heartbeat too late?); stopping "
                        "this runner's attempt", logging.WARNING)
            backend.stop(name)
            continue
        worker = record.read_json(t.run_dir / record.WORKER) or {}
        record.write_status(t.run_dir, heartbeat=time.time(), heartbeat_utc=record.utc(),
                            phase=worker.get("phase"), worker=worker)


def _stop_children(running: dict[str, float], by_name: dict[str, RunTarget], backend, grace: float) -> None:
    """Asks every running run to save and stop, waits up to ``grace`` seconds, then kills the rest."""
    for name in running:
        _write_stop(by_name[name], 1)
    backend.stop()
    deadline = time.time() + grace
    while running and time.time() < deadline:
        for name, _ in backend.wait(timeout=0.5):
            running.pop(name, None)
    backend.kill()


def _outcome_lines(failed: dict[str, dict[str, Any]], tries, blocked: dict[str, str], waiting: dict[str, str],
                   elsewhere: dict[str, dict[str, Any]], by_name: dict[str, RunTarget], collect_error) -> list[str]:
    """The summary's lines for every run not done (failed, blocked, waiting, or leased elsewhere)
    and for a collect that failed."""
    lines = []
    for name, res in failed.items():
        lines.append(f"  failed: {name} after {tries[name]} attempt(s) in this sweep: {res.get('message')}; log: "
                     f"{res.get('log') or by_name[name].run_dir}")
    for base, names in _by_base(blocked, by_name).items():
        lines.append(f"  blocked: {', '.join(names)}: not launched, their base {base} failed; fix the base and rerun "
                     "(the base resumes, then these runs start)")
    for base, names in _by_base(waiting, by_name).items():
        lines.append(f"  waiting: {', '.join(names)}: their base {base} runs under another runner; rerun (or "
                     "--wait-others) once it is done")
    for name, holder in elsewhere.items():
        lines.append(f"  elsewhere: {name} leased by {holder.get('host')}:{holder.get('pid')} (heartbeat "
                     f"{holder.get('age', 0):.0f} s ago); rerun (or --wait-others) to collect it when it is done")
    if collect_error:
        lines.append(f"  collect failed: {collect_error}")
    return lines


def _by_base(names: dict[str, str], by_name: dict[str, RunTarget]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name in names:
        out.setdefault(by_name[name].base, []).append(name)
    return out


def _base_gate(t: RunTarget, by_name: dict[str, RunTarget], succeeded, failed, running, elsewhere, gates,
               wait_others: bool) -> str:
    """Whether a target may be launched now: ``ready`` (no base, or its base is done), ``wait`` (the
    base is still to run or running here), ``blocked`` (the base failed or is itself blocked) or
    ``waiting`` (the base runs under another runner this one does not wait for)."""
    if not t.base or t.base in succeeded:
        return "ready"
    base = by_name[t.base]
    if t.base in failed or t.base in gates["blocked"]:
        return "blocked"
    if t.base in running:  # its attempt has not been reported back yet
        return "wait"
    if record.run_progress(base.run_dir, base.steps)["done"]:
        return "ready"
    if t.base in elsewhere and not wait_others:
        return "waiting"
    return "wait"


def _write_stop(t: RunTarget, level: int) -> None:
    """The stop request a Ray task polls (the local backend's threads get it in memory too)."""
    try:
        (t.run_dir / record.STOP).write_text("kill" if level >= 2 else "term")
    except OSError:
        pass


def _fill(queue, by_name, running, backend, owner, options, version, eval_args, elsewhere, succeeded, tries, launched,
          display, since_poll, failed, gates) -> bool:
    """Leases and launches targets until every slot is busy; returns whether held targets were polled."""
    polled = False
    for _ in range(len(queue)):
        if len(running) >= backend.slots:
            break
        name = queue.popleft()
        t = by_name[name]
        if name in elsewhere:
            if not options.wait_others:
                continue  # left to the other runner: dropped from this runner's queue
            if since_poll < min(options.heartbeat, 5.0):
                queue.append(name)
                continue
            polled = True
        if record.run_progress(t.run_dir, t.steps)["done"]:
            elsewhere.pop(name, None)
            succeeded.append(name)
            display.say(f"sweep: {name}: done (by another runner)")
            continue
        gate = _base_gate(t, by_name, succeeded, failed, running, elsewhere, gates, options.wait_others)
        if gate == "wait":
            queue.append(name)
            continue
        if gate == "blocked":
            gates["blocked"][name] = f"base {t.base} failed"
            display.say(f"sweep: {name}: not launched: its base {t.base} failed", logging.WARNING)
            continue
        if gate == "waiting":
            gates["waiting"][name] = t.base
            continue
        age = record.lease_age(t.run_dir)
        stale = (record.read_json(t.run_dir / record.LEASE) or {}) if age is not None else {}
        why = record.stale_reason(stale, age, options.lease_timeout) if age is not None else None
        if why:
            display.say(f"sweep: {name}: taking over the stale lease of {stale.get('host')}:{stale.get('pid')} "
                        f"({why})", logging.WARNING)
        got, holder = record.try_acquire(t.run_dir, owner, options.lease_timeout)
        if not got:
            if name not in elsewhere:
                display.say(f"sweep: {name}: leased by {holder.get('host')}:{holder.get('pid')} (heartbeat "
                            f"{holder.get('age', 0):.0f} s ago); " + ("waiting for it" if options.wait_others else
                                                                     "leaving it to that runner"))
            elsewhere[name] = holder
            if options.wait_others:
                queue.append(name)
            continue
        elsewhere.pop(name, None)
        if record.run_progress(t.run_dir, t.steps)["done"]:  # finished by a runner that just let go
            record.release(t.run_dir, owner)
            succeeded.append(name)
            continue
        _launch(t, backend, owner, options, version, eval_args, tries, display)
        running[name] = time.time()
        if name not in launched:
            launched.append(name)
    return polled


def _launch(t: RunTarget, backend, owner, options: SweepOptions, version, eval_args, tries, display) -> None:
    tries[t.name] += 1
    status = record.read_status(t.run_dir)
    attempt = int(status.get("attempts", 0)) + 1
    train_cmd, eval_cmd = t.train_command(options.python), t.eval_command(eval_args, options.python)
    rec = record.read_json(t.run_dir / record.RECORD) or {
        "name": t.name, "plan_entry": t.entry, "config_file": t.config_file, "overrides": t.overrides,
        "added_overrides": t.added_overrides, "resolved_config": t.resolved_config, "created": record.utc(),
        "launches": [],
    }
    launched_at = record.utc()
    first = status.get("started_at") or rec.get("started_at") or launched_at  # the first attempt's start, kept
    rec["started_at"] = first
    rec["launches"].append({"attempt": attempt, "time": launched_at, "host": owner["host"], "runner_pid": owner["pid"],
                            "backend": options.backend, "code_version": version,
                            "train_command": shlex.join(train_cmd), "eval_command": shlex.join(eval_cmd),
                            "cwd": os.getcwd()})
    record.write_json_atomic(t.run_dir / record.RECORD, rec)
    now = time.time()
    record.write_status(t.run_dir, state="running", attempts=attempt, host=owner["host"], pid=owner["pid"],
                        owner=owner["id"], backend=options.backend, phase=None, started=record.utc(now), started_at=first,
                        heartbeat=now, heartbeat_utc=record.utc(now), message="", log=None, returncode=None,
                        history=status.get("history", []))
    for stale in (record.STOP, record.WORKER):
        try:
            (t.run_dir / stale).unlink()
        except FileNotFoundError:
            pass
    job = {"name": t.name, "run_dir": str(t.run_dir), "cwd": os.getcwd(), "train_cmd": train_cmd, "eval_cmd": eval_cmd,
           "steps": t.steps, "attempt": attempt, "grace": options.grace, "env": _job_env(t.run_dir.parent)}
    progress = record.run_progress(t.run_dir, t.steps)
    what = ("evaluate" if progress["final"] else f"resume from step {progress['checkpoints'][-1]}"
            if progress["checkpoints"] else f"train from base {t.base}" if t.base else "train")
    display.say(f"sweep: {t.name}: start (attempt {attempt}, {what})")
    backend.submit(t.name, job)


def _finish(t: RunTarget, result, owner, stopping, retries, tries, queue, succeeded, failed, interrupted, durations,
            display, t0) -> None:
    status = record.read_status(t.run_dir)
    entry = {"attempt": status.get("attempts"), "state": result["state"], "phase": result.get("phase"),
             "returncode": result.get("returncode"), "started": status.get("started"), "ended": record.utc(),
             "seconds": round(time.time() - t0, 1), "host": result.get("host"), "resumed_from": result.get("resumed_from"),
             "trained": result.get("trained"), "message": result.get("message"), "log": result.get("log")}
    history = status.get("history", []) + [entry]
    state = result["state"]
    if state == "failed" and stopping:
        state = "interrupted"
    if state == "succeeded":
        record.write_status(t.run_dir, state="succeeded", history=history, message="", log=None, returncode=0)
        succeeded.append(t.name)
        durations.append(time.time() - t0)
        display.say(f"sweep: {t.name}: done in {time.time() - t0:.0f} s")
    elif state == "interrupted":
        record.write_status(t.run_dir, state="interrupted", history=history, message=result.get("message"),
                            log=result.get("log"), returncode=result.get("returncode"))
        interrupted.append(t.name)
        display.say(f"sweep: {t.name}: interrupted ({result.get('message')})", logging.WARNING)
    else:
        again = tries[t.name] <= retries
        record.write_status(t.run_dir, state="failed", history=history, message=result.get("message"),
                            log=result.get("log"), returncode=result.get("returncode"), retrying=again)
        display.say(f"sweep: {t.name}: failed ({result.get('message')}); log: {result.get('log')}"
                    + (f"; retrying ({tries[t.name]}/{retries} retries used)" if again else
                       f"; giving up after {tries[t.name]} attempt(s)"), logging.WARNING)
        if again:
            queue.append(t.name)
        else:
            failed[t.name] = result
    record.release(t.run_dir, owner)


def _collect(root: Path, done: Sequence[RunTarget], by_name: dict[str, RunTarget],
             validation_only: Sequence[str] = ()) -> tuple[str | None, int, str | None]:
    """ROOT/runs.csv from every finished target (written to a temporary file, then renamed). The
    plan says which runs are mid-training runs of which base (other warm starts, e.g. MergeMix's
    experts, are collected as ordinary runs), and which domains no run trains on (its
    ``validation_only``: a held-out target gets a loss: column and no mix: column)."""
    if not done:
        return None, 0, None
    from data_mixture.collect import CollectError, collect, write_columns

    bases = {str(t.run_dir): str(by_name[t.base].run_dir) for t in done if t.base}
    try:
        got = collect([str(t.run_dir) for t in done], bases=bases, validation_only=tuple(validation_only))
    except CollectError as e:
        return None, 0, str(e)
    out = root / "runs.csv"
    tmp = root / f".runs.csv.{os.getpid()}.tmp"
    write_columns(got.columns, tmp)
    os.replace(tmp, out)
    return str(out), len(got.columns.get("run", [])), None
