"""`python -m tideborn.tools.train_run start|status|stop|watch|tensorboard` (also `tideborn run ...`).

Runs a trainer detached from the terminal and reports on it; `tensorboard` writes its figures as TensorBoard
scalars. No torch: `status` and `watch` start in a fraction of a second. Commands, states, exit codes and
anomaly rules: docs/run-tools.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import psutil

from tideborn.cliparser import OneLineParser
from tideborn.errors import UserError, report_error, report_user_error
from tideborn.humanize import clock, duration
from tideborn.rundir.access import check_readable_dir
from tideborn.rundir.anomaly import Anomaly, AnomalyThresholds
from tideborn.rundir.events import encode_event
from tideborn.rundir.files import PidRecord, process_facts
from tideborn.rundir.kinds import RunEnded
from tideborn.rundir.layout import EVENTS_FILE, PID_FILE, temp_checkpoints
from tideborn.rundir.report import event_text, status_text
from tideborn.rundir.state import RunTracker
from tideborn.tools import tensorboard_scalars
from tideborn.tools.control import (
    LAUNCH_WAIT_SECONDS,
    LaunchRequest,
    NotRunning,
    TrainerExited,
    is_alive,
    launch_run,
    orphaned_workers,
    recorded_process,
    send_signal,
    signal_run,
)
from tideborn.trainer.options import add_settings_arguments

OK, ANOMALY, USAGE, NO_RUN, INTERRUPTED = 0, 1, 2, 3, 130
ENDED = ("finished", "stopped", "failed", "vanished")
KILL_WAIT_SECONDS = 10.0
SAVE_TIMEOUT_SECONDS = 300.0
"""`stop --force` waits this long for a checkpoint save in progress before it kills the trainer anyway."""
WAIT_REPORT_SECONDS = 5.0
WATCH_CHECK_MILLISECONDS = 1000
"""watch asks about the process (vanished? stalled?) at least this often while the files are quiet."""


def _thresholds(parser: argparse.ArgumentParser) -> None:
    d = AnomalyThresholds()
    parser.add_argument("--stall-seconds", type=float, default=d.stall_seconds, metavar="S",
                        help=f"stalled after S seconds with no output (default {d.stall_seconds:g})")
    parser.add_argument("--divergence-factor", type=float, default=d.divergence_factor, metavar="X",
                        help=f"diverged when the smoothed loss is X times its best (default {d.divergence_factor:g})")
    parser.add_argument("--divergence-warmup-steps", type=int, default=d.divergence_warmup_steps, metavar="N",
                        help=f"no divergence judged before step N (default {d.divergence_warmup_steps})")
    parser.add_argument("--smoothing", type=float, default=d.smoothing, metavar="A",
                        help=f"weight of the newest loss in the moving average (default {d.smoothing:g})")


def node_range(text: str) -> str:
    """`start --nnodes`: `MIN:MAX` (or `N`) nodes, as torchrun takes it, 1 <= MIN <= MAX."""
    parts = text.split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        low, high = 0, -1
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX nodes with 1 <= MIN <= MAX (or N); got {text!r}")
    return text


def wait_seconds(text: str) -> float:
    """`stop --timeout`, `start --wait`: 0 or more seconds (inf waits for good); a negative or NaN wait is a
    usage error."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds: {text!r}") from None
    if not seconds >= 0:  # also false for NaN, which would otherwise never compare past the deadline
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text!r}")
    return seconds


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description="Start, check, stop and follow a detached training run; show "
                                                  "it in TensorBoard.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{start,status,stop,watch,tensorboard}",
                                parser_class=OneLineParser)
    start = sub.add_parser("start", help="validate the settings and start the trainer detached",
                           description="Validate the settings and start the trainer detached.")
    add_settings_arguments(start)
    start.add_argument("--fresh", action="store_true", help="passed to train: start over at step 0")
    start.add_argument("--resume", metavar="PATH", help="passed to train: resume from this checkpoint")
    start.add_argument("--stop-at-step", type=int, metavar="N", help="passed to train: stop after step N")
    start.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                       help="launch N trainer processes through torchrun (DDP, one per GPU)")
    start.add_argument("--nnodes", type=node_range, metavar="MIN:MAX",
                       help="an elastic job over several nodes: launch this node's part through torchrun's elastic "
                            "agent (c10d rendezvous; needs --rdzv-endpoint and --rdzv-id)")
    start.add_argument("--max-restarts", type=int, default=3, metavar="N",
                       help="with --nnodes: restarts after a failure before the job gives up (default 3)")
    start.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="with --nnodes: the rendezvous, the same on "
                                                                     "every node")
    start.add_argument("--rdzv-id", metavar="ID", help="with --nnodes: the job's id, the same on every node")
    start.add_argument("--wait", type=wait_seconds, default=LAUNCH_WAIT_SECONDS, metavar="S",
                       help="seconds to wait for the trainer to start training and report how it went "
                            f"(default {LAUNCH_WAIT_SECONDS:g}; 0: launch and return at once)")
    status = sub.add_parser("status", help="progress and anomalies of a run (never changes the run)",
                            description="Progress and anomalies of a run (never changes the run).")
    status.add_argument("--out-dir", required=True, type=Path, help="the run directory")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    _thresholds(status)
    stop = sub.add_parser("stop", help="SIGTERM the recorded trainer and wait for it to checkpoint and exit",
                          description="SIGTERM the recorded trainer and wait for it to checkpoint and exit.")
    stop.add_argument("--out-dir", required=True, type=Path, help="the run directory")
    stop.add_argument("--timeout", type=wait_seconds, default=120.0, metavar="S",
                      help="seconds to wait (default 120; inf: until it exits)")
    stop.add_argument("--force", action="store_true",
                      help="SIGKILL it if it has not exited after the timeout (never inside a checkpoint save)")
    stop.add_argument("--save-timeout", type=wait_seconds, default=SAVE_TIMEOUT_SECONDS, metavar="S",
                      help="with --force: how long a checkpoint save in progress may still take before SIGKILL "
                           f"(default {SAVE_TIMEOUT_SECONDS:g})")
    watch = sub.add_parser("watch", help="stream the run's events (and anomalies) as they are written",
                           description="Stream the run's events (and anomalies) as they are written.")
    watch.add_argument("--out-dir", required=True, type=Path, help="the run directory")
    watch.add_argument("--format", choices=("json", "text"), default="json", help="JSON lines (default) or text")
    watch.add_argument("--follow-only", action="store_true", help="only events written from now on")
    watch.add_argument("--forever", action="store_true", help="keep following after the run ends")
    _thresholds(watch)
    board = sub.add_parser("tensorboard", help="write the run's figures as TensorBoard scalars (from events.jsonl)",
                           description="Write the run's step, eval, match and gpu figures as TensorBoard scalars, "
                                       "from events.jsonl (a finished run, an old one, or a live one with --follow).")
    board.add_argument("--out-dir", required=True, type=Path, help="the run directory")
    board.add_argument("--logdir", type=Path, metavar="DIR",
                       help=f"where to write {tensorboard_scalars.SCALARS_FILE} (default RUN_DIR/"
                            f"{tensorboard_scalars.DEFAULT_LOGDIR}); give tensorboard --logdir this folder or "
                            "one above it")
    board.add_argument("--follow", action="store_true", help="keep adding the live run's figures until it ends")
    return parser


def thresholds_of(args: argparse.Namespace) -> AnomalyThresholds:
    try:
        return AnomalyThresholds(divergence_factor=args.divergence_factor,
                                 divergence_warmup_steps=args.divergence_warmup_steps,
                                 smoothing=args.smoothing, stall_seconds=args.stall_seconds)
    except ValueError as exc:
        raise UserError(f"{exc} (--divergence-factor, --divergence-warmup-steps, --smoothing, "
                        "--stall-seconds)") from None


def command_line(prog: str, *args: object) -> str:
    """A command printed for the user to paste: `prog` (the words the tools were called by) and `args`, each quoted
    for the shell where it needs it, so that a path with a space or a `;` stays one argument (`runs/ckpt/x`, which
    needs none, stays bare)."""
    return f"{prog} {shlex.join(str(arg) for arg in args)}"


def run_dir_problem(run_dir: Path, prog: str = "python -m tideborn.tools.train_run") -> str | None:
    """Why `run_dir` holds no run to report on, or None (`prog`: how the user called the run tools). Another
    user's run that this user may not read is a `UserError` saying whose it is."""
    check_readable_dir(run_dir)
    try:
        exists, is_dir = run_dir.exists(), run_dir.is_dir()
    except OSError as exc:  # a name too long, a directory we may not enter: no run we can read
        return f"{run_dir}: {exc.strerror}"
    if not exists:
        return f"{run_dir}: no such directory"
    if not is_dir:
        return f"{run_dir}: not a directory"
    if not (run_dir / PID_FILE).exists() and not (run_dir / EVENTS_FILE).exists():
        return f"{run_dir}: no run here (neither {PID_FILE} nor {EVENTS_FILE}); start one with {prog} start"
    return None


# -- commands ---------------------------------------------------------------------------------------

def fail(args: argparse.Namespace, message: str, exit_code: int) -> int:
    """The one error line in every command's style, `PROG COMMAND: error: ...`, for the failures that are
    not bad input (those are a `UserError`, exit 2): no run there (3), a trainer that crashed (1)."""
    report_error(message, f"{args.prog} {args.command}")
    return exit_code


def command_start(args: argparse.Namespace, prog: str) -> int:
    extra: list[str] = ["--fresh"] if args.fresh else []
    if args.resume:
        extra += ["--resume", args.resume]
    if args.stop_at_step is not None:
        extra += ["--stop-at-step", str(args.stop_at_step)]
    if args.nnodes is not None and not (args.rdzv_endpoint and args.rdzv_id):
        return fail(args, "--nnodes needs --rdzv-endpoint HOST:PORT and --rdzv-id ID (the same on every node)", USAGE)
    if args.nnodes is None and (args.rdzv_endpoint or args.rdzv_id):
        return fail(args, "--rdzv-endpoint and --rdzv-id go with --nnodes MIN:MAX (an elastic job)", USAGE)
    if args.max_restarts < 0:
        return fail(args, f"--max-restarts must be >= 0; got {args.max_restarts}", USAGE)
    request = LaunchRequest(config=args.config, overrides=tuple(args.overrides),
                            flags={"type": args.type, "network": args.network, "mode": args.mode},
                            trainer_args=tuple(extra), nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
                            max_restarts=args.max_restarts, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id)
    try:
        launched = launch_run(request, wait_seconds=args.wait)
    except TrainerExited as exc:
        return fail(args, str(exc), ANOMALY)
    run_dir = launched.run_dir
    pid = launched.record.pid
    step = f" at step {launched.started_step:,}" if launched.started_step is not None else ""
    if launched.outcome == "ended":
        print(f"the trainer (pid {pid}) started{step} and has exited already, with status {launched.exit_code}")
    elif launched.outcome == "starting":
        print(f"started the trainer: pid {pid}; not training yet after {args.wait:g} s (still starting up: "
              "importing torch, loading the checkpoint); status says when it is")
    elif launched.outcome == "running":
        print(f"started the trainer: pid {pid}, training{step}")
    else:
        print(f"started the trainer: pid {pid}")
    print(f"  out dir  {run_dir}")
    print(f"  log      {run_dir / 'train.log'}")
    print(f"  status   {command_line(prog, 'status', '--out-dir', run_dir)}")
    print(f"  stop     {command_line(prog, 'stop', '--out-dir', run_dir)}")
    return ANOMALY if launched.outcome == "ended" and launched.exit_code != 0 else OK


def command_status(args: argparse.Namespace) -> int:
    thresholds = thresholds_of(args)
    run_dir: Path = args.out_dir
    if problem := run_dir_problem(run_dir, args.prog):
        if args.json:
            print(json.dumps({"run_dir": str(run_dir), "state": "not started", "error": problem, "anomalies": []}))
        return fail(args, problem, NO_RUN)
    tracker = RunTracker(run_dir, thresholds, start="tail")
    tracker.refresh(keep_events=False)
    tracker.finish_log()
    report = tracker.status()
    print(json.dumps(report.to_json()) if args.json else status_text(report))
    return ANOMALY if report.anomalies else OK


def command_stop(args: argparse.Namespace) -> int:
    run_dir: Path = args.out_dir
    if problem := run_dir_problem(run_dir, args.prog):
        return fail(args, problem, NO_RUN)
    tracker = RunTracker(run_dir, start="end")
    tracker.refresh()
    # Between a failed attempt and the agent's restart of it the job lives on in the agent: stopping the agent
    # there ends it without the restart.
    between_attempts = tracker.restart_pending()
    terminal_before = tracker.terminal
    if tracker.ended() and not between_attempts:
        return fail(args, f"{run_dir}: the run is not running: it already ended ({tracker.terminal.kind} "
                          f"at step {tracker.terminal.step}); nothing was signalled", NO_RUN)
    stopping = tracker.stopping()
    try:
        # A stop in progress is waited for, never signalled again: the trainer would ignore a repeated
        # SIGTERM anyway, and an older one would have died of it in the middle of its checkpoint save.
        record = recorded_process(run_dir) if stopping is not None else signal_run(run_dir, signal.SIGTERM)
        if args.force:  # --force may have to kill it: another user's trainer is said now, not after the wait
            send_signal(run_dir, record, 0)
    except NotRunning as exc:
        if orphans := orphaned_workers(run_dir):  # torchrun's agent is gone, its workers train on
            return _stop_orphans(args, tracker, orphans, stopping is not None)
        return fail(args, f"{exc}; state: {tracker.state}", NO_RUN)
    step = tracker.last_step.step if tracker.last_step is not None else None
    if stopping is not None:
        asked = stopping.since() or time.time()
        print(f"a stop is already in progress: pid {record.pid} got {stopping.signal or 'a stop signal'} at "
              f"{clock(asked)} ({duration(max(0.0, time.time() - asked))} ago); not signalling it again; waiting up "
              f"to {args.timeout:g} s for it to save a checkpoint and exit", flush=True)
    elif between_attempts:
        print(f"sent SIGTERM to torchrun's agent, pid {record.pid}, between a failed attempt (step {step}) and its "
              f"restart: no restart; waiting up to {args.timeout:g} s for it to exit", flush=True)
    else:
        print(f"sent SIGTERM to pid {record.pid} (last logged step {step}); waiting up to {args.timeout:g} s "
              "for it to finish its step, save a checkpoint and exit", flush=True)
    if _suspended(record):
        then = (f"--force: waiting {args.timeout:g} s for that, then SIGKILL" if args.force
                else f"then {command_line(args.prog, 'stop', '--out-dir', run_dir)} waits for it; this stop does not "
                     "wait")
        print(f"pid {record.pid} is stopped (SIGSTOP, Ctrl-Z or a debugger), so it cannot act on the SIGTERM, which "
              f"waits until it is continued: kill -CONT {record.pid}; {then}", flush=True)
        if not args.force:
            return ANOMALY
    exited = _wait_for_exit(tracker, record, time.monotonic() + args.timeout)
    if not exited:
        saving = _saves_in_progress(tracker, record)
        if not args.force:
            doing = (f"; a checkpoint save is in progress ({saving[0].name})" if saving else "")
            print(f"pid {record.pid} is still running after {args.timeout:g} s (state {tracker.state}{doing}); "
                  f"stop --force kills it (after the save in progress, if any, completes)", flush=True)
            return ANOMALY
        if not _force_kill(tracker, record, args):
            return ANOMALY
    return _report_stop(tracker, record, between_attempts, terminal_before)


def _stop_orphans(args: argparse.Namespace, tracker: RunTracker, workers: list[PidRecord], in_progress: bool) -> int:
    """torchrun's agent died and its workers outlived it. They stop by themselves within seconds
    (trainer/agent_watch.py); ones that did not (hung, suspended, or from before that) get SIGTERM each, and the
    stop goes on as any other: wait for the checkpoint and the exit; `--force` kills what is left."""
    run_dir, pids = tracker.run_dir, ", ".join(str(worker.pid) for worker in workers)
    if not in_progress:
        for worker in workers:
            try:
                send_signal(run_dir, worker, signal.SIGTERM)
            except NotRunning:
                pass  # that one has just exited: nothing to stop
    step = tracker.last_step.step if tracker.last_step is not None else None
    said = "their stop is in progress" if in_progress else "sent SIGTERM to each"
    print(f"torchrun's agent is gone, but its workers still run (pids {pids}): {said} (last logged step {step}); "
          f"waiting up to {args.timeout:g} s for them to finish their step, save a checkpoint and exit", flush=True)
    if frozen := [str(worker.pid) for worker in workers if _suspended(worker)]:
        then = (f"--force: waiting {args.timeout:g} s for that, then SIGKILL" if args.force
                else "this stop does not wait")
        print(f"pid {', '.join(frozen)} is stopped (SIGSTOP, Ctrl-Z or a debugger), so it cannot act on the "
              f"SIGTERM, which waits until it is continued: kill -CONT {' '.join(frozen)}; {then}", flush=True)
        if not args.force:
            return ANOMALY
    deadline = time.monotonic() + args.timeout
    if not all([_wait_for_exit(tracker, worker, deadline) for worker in workers]):  # a list: wait for each
        if not args.force:
            print(f"workers still running after {args.timeout:g} s (state {tracker.state}); stop --force kills them "
                  "(after the save in progress, if any, completes)", flush=True)
            return ANOMALY
        if not all([_force_kill(tracker, worker, args) for worker in workers if is_alive(worker)]):
            return ANOMALY
    return _report_stop(tracker, workers[0], False, tracker.terminal)


def _report_stop(tracker: RunTracker, record: PidRecord, between_attempts: bool,
                 terminal_before: RunEnded | None) -> int:
    """After the stopped process exited: what the run wrote meanwhile, how it ended and its last checkpoint."""
    run_dir = tracker.run_dir
    update = tracker.refresh()
    _print_stop_progress(update.events)
    ck = tracker.status().last_checkpoint
    where = f"; last checkpoint {ck.path} (step {ck.step})" if ck else "; no checkpoint"
    if between_attempts and tracker.ended() and tracker.terminal is terminal_before:
        # No worker ran after the signal: the failed attempt's checkpoints are the job's last.
        print(f"the job ended before its restart: the last attempt's {terminal_before.kind} at step "
              f"{terminal_before.step} stays its last event{where}")
        return OK
    if tracker.ended() and tracker.terminal is not None:
        t = tracker.terminal
        how = t.reason or t.error or ""
        print(f"the run ended: {t.kind} at step {t.step}" + (f" ({how})" if how else "") + where)
        return OK if t.kind in ("run_stopped", "run_finished") else ANOMALY
    print(f"pid {record.pid} exited without writing a terminal event (see {run_dir / 'train.log'}){where}")
    return ANOMALY


def _force_kill(tracker: RunTracker, record: PidRecord, args: argparse.Namespace) -> bool:
    """`--force` after the timeout: SIGKILL, but never in the middle of a checkpoint save. A save in
    progress is waited for, up to `--save-timeout` seconds; once it completes the trainer gets a few
    seconds to write its terminal event and exit by itself. Says which it was. False: it survived SIGKILL."""
    save_deadline = time.monotonic() + args.save_timeout
    grace_until: float | None = None
    seen: Path | None = None
    while True:
        alive = is_alive(record)
        _print_stop_progress(tracker.refresh().events)
        if not alive:
            return True
        saving, now = _saves_in_progress(tracker, record), time.monotonic()
        if saving:
            if seen is None:
                print(f"  a checkpoint save is in progress ({saving[0].name}, {_size(saving[0])} so far): "
                      f"waiting up to {args.save_timeout:g} s (--save-timeout) for it to complete before SIGKILL",
                      flush=True)
            seen, grace_until = saving[0], None
            if now >= save_deadline:
                why = (f"as its checkpoint save did not complete within --save-timeout {args.save_timeout:g} s "
                       f"(the partial {seen.name} is left; the next run removes it)")
                break
        elif seen is not None:
            grace_until = grace_until or now + KILL_WAIT_SECONDS
            if now >= grace_until:
                why = (f"after its checkpoint save completed ({seen.name[1:].split('.tmp-')[0]}), as it had not "
                       f"exited {KILL_WAIT_SECONDS:g} s later")
                break
        else:
            why = f"after {args.timeout:g} s (no checkpoint save was in progress)"
            break
        time.sleep(0.1)
    try:
        if not is_alive(record):  # the very process signalled before (train.pid's, or an orphaned rank 0)
            return True
        send_signal(tracker.run_dir, record, signal.SIGKILL)
    except NotRunning:
        return True  # it exited on its own in the meantime
    print(f"sent SIGKILL to pid {record.pid} {why}", flush=True)
    if not _wait_for_exit(tracker, record, time.monotonic() + KILL_WAIT_SECONDS):
        print(f"pid {record.pid} survived SIGKILL for {KILL_WAIT_SECONDS:g} s", flush=True)
        return False
    return True


def _saves_in_progress(tracker: RunTracker, record: PidRecord) -> list[Path]:
    """The launch's checkpoint temp files (`.step-N.pt.tmp-PID`): a save is being written. Only those of
    its pids count (the recorded one, and under torchrun rank 0's from `run_started`): a stale one that
    a killed run left is not a save in progress."""
    pids = {record.pid}
    if tracker.session_is_launch() and tracker.run_started is not None and tracker.run_started.pid is not None:
        pids.add(tracker.run_started.pid)
    return [path for path in temp_checkpoints(tracker.run_dir) if int(path.name.rsplit("-", 1)[1]) in pids]


def _size(path: Path) -> str:
    try:
        return f"{path.stat().st_size / 1e6:,.0f} MB"
    except FileNotFoundError:
        return "complete"


def _suspended(record: PidRecord) -> bool:
    """Stopped by SIGSTOP, Ctrl-Z (SIGTSTP) or a debugger: alive, but acting on no signal until continued."""
    return process_facts(record.pid).status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


def _wait_for_exit(tracker: RunTracker, record: PidRecord, deadline: float) -> bool:
    """Poll the process (not our child: no waitpid), print what the run writes meanwhile, and say every
    few seconds what is still awaited."""
    began = last_said = time.monotonic()
    while True:
        alive = is_alive(record)
        _print_stop_progress(tracker.refresh().events)
        if not alive:
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        if now - last_said >= WAIT_REPORT_SECONDS:
            last = tracker.last_event or {}
            frozen = f"; it is stopped (SIGSTOP): kill -CONT {record.pid} continues it" if _suspended(record) else ""
            print(f"  still waiting for pid {record.pid} to exit ({now - began:.0f} s, {deadline - now:.0f} s left; "
                  f"last event: {last.get('kind', 'none')} at step {last.get('step')}{frozen})", flush=True)
            last_said = now
        time.sleep(0.1)


def _print_stop_progress(events: list[dict]) -> None:
    for event in events:
        kind = event.get("kind")
        if kind == "step":
            print(f"  step {event.get('step')} done", flush=True)
        elif kind == "checkpoint_saved":
            print(f"  checkpoint saved: {event.get('path')}", flush=True)
        elif kind == "stop_requested":
            print(f"  stop requested ({event.get('signal')}) at step {event.get('step')}", flush=True)
        elif kind == "warning":
            print(f"  warning at step {event.get('step')}: {event.get('message')}", flush=True)
        elif kind in ("run_stopped", "run_finished", "run_failed"):
            print(f"  {kind} at step {event.get('step')}", flush=True)


def command_watch(args: argparse.Namespace) -> int:
    thresholds = thresholds_of(args)
    run_dir: Path = args.out_dir
    if problem := run_dir_problem(run_dir, args.prog):
        return fail(args, problem, NO_RUN)
    tracker = RunTracker(run_dir, thresholds, start="end" if args.follow_only else "beginning")
    text = args.format == "text"
    flagged = False

    def show(update) -> str:
        nonlocal flagged
        for event in update.events:
            record = {k: v for k, v in event.items() if not k.startswith("_")}
            sys.stdout.write((event_text(record) if text else json.dumps(record, separators=(",", ":"))) + "\n")
        for anomaly in update.anomalies:
            flagged = True
            sys.stdout.write(_anomaly_line(anomaly, text) + "\n")
        sys.stdout.flush()
        return update.state

    state = show(tracker.refresh())
    if state not in ENDED or args.forever:
        import watchfiles  # only here: status and the rest never pay for it

        # inotify wakes us within `step` ms of a write (no busy polling); the timeout wakes us anyway
        # every second to ask about the process, which files alone cannot show to have died or hung.
        for _changes in watchfiles.watch(run_dir, watch_filter=None, debounce=100, step=20,
                                         rust_timeout=WATCH_CHECK_MILLISECONDS, yield_on_timeout=True,
                                         recursive=False):
            state = show(tracker.refresh())
            if state in ENDED and not args.forever:
                break
    return OK if state in ("finished", "stopped") and not flagged else ANOMALY


def command_tensorboard(args: argparse.Namespace) -> int:
    run_dir: Path = args.out_dir
    if problem := run_dir_problem(run_dir, args.prog):
        return fail(args, problem, NO_RUN)
    logdir: Path = args.logdir or tensorboard_scalars.default_logdir(run_dir)
    try:
        converted = tensorboard_scalars.convert_run(run_dir, logdir, follow=args.follow,
                                                    say=lambda line: print(line, flush=True))
    except tensorboard_scalars.RunDirGone as exc:  # as when there was none to begin with
        return fail(args, str(exc), NO_RUN)
    print(f"wrote {converted.summary()}")
    print(f"  view  {shlex.join(['tensorboard', '--logdir', str(logdir)])}")
    return INTERRUPTED if converted.interrupted else OK


def _anomaly_line(anomaly: Anomaly, text: bool) -> str:
    fields = {"rule": anomaly.rule, "message": anomaly.message, "evidence": anomaly.evidence}
    if text:
        return event_text({"kind": "anomaly", "time": anomaly.time, **fields})
    return encode_event("anomaly", fields, now=anomaly.time).decode().rstrip("\n")


def main(argv: list[str] | None = None, prog: str = "python -m tideborn.tools.train_run") -> int:
    args = build_parser(prog).parse_args(argv)
    args.prog = prog
    try:
        if args.command == "start":
            return command_start(args, prog)
        handler = {"status": command_status, "stop": command_stop, "watch": command_watch,
                   "tensorboard": command_tensorboard}[args.command]
        return handler(args)
    except UserError as exc:
        return report_user_error(exc, f"{prog} {args.command}")
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`watch | head`): leave quietly, and keep Python's exit flush quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return OK


if __name__ == "__main__":
    sys.exit(main())
