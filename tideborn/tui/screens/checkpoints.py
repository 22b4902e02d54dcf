"""A run's latest eval figures (as `train_run status` prints them) and its checkpoints (step, size, age),
newest first; one can be picked to resume the run from (`--resume`, through the dashboard's start checks
and question) or to export as ONNX (`tideborn export`, in a subprocess that never blocks the UI)."""

from __future__ import annotations

import signal
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Input, Static

from tideborn.errors import UserError
from tideborn.humanize import duration, shortened
from tideborn.outputs import check_output_before_work
from tideborn.rundir.layout import list_checkpoints
from tideborn.rundir.report import eval_text
from tideborn.rundir.status import RunStatus
from tideborn.safefile import remove_stale_temps
from tideborn.tui.options import TuiOptions

LIVE_STATES = ("running", "stalled")
REFRESH_SECONDS = 2.0
EXPORT_ARGV = [sys.executable, "-c", "import sys; from tideborn.cli import main; sys.exit(main())", "export"]
"""`tideborn export`, with this interpreter (the console script may not be on PATH)."""
EXPORT_STOP_SECONDS = 3.0
"""How long an export stopped by quitting has to end after SIGINT before it is killed (less than the
app's EXIT_GRACE_SECONDS, so that a signalled app still stops it before its watchdog ends the process)."""


@dataclass(frozen=True)
class CheckpointFile:
    step: int
    path: Path
    size: int
    mtime: float


def checkpoint_files(run_dir: Path) -> list[CheckpointFile]:
    """The run's step checkpoints, newest first, as `tideborn.rundir.list_checkpoints` finds them, minus
    symbolic links (never followed: a link in a run directory is not the trainer's, docs/reliability.md);
    size and time from the file itself. A file removed meanwhile (pruned by the trainer) is left out."""
    found = []
    for step, path in reversed(list_checkpoints(run_dir)):
        try:
            info = path.lstat()
        except OSError:  # pruned or archived since it was listed: it is no longer a checkpoint of the run
            continue
        if path.is_symlink():
            continue
        found.append(CheckpointFile(step, path, info.st_size, info.st_mtime))
    return found


def size_text(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def export_command(checkpoint: Path, out: Path) -> list[str]:
    return [*EXPORT_ARGV, "--checkpoint", str(checkpoint), "--out", str(out)]


class ExportJob:
    """`tideborn export` for one checkpoint, as a subprocess the app can wait for or stop (`stop`): the
    app keeps its jobs (`TidebornApp.exports`) so that quitting never leaves one running on its own."""

    def __init__(self, checkpoint: Path, out: Path) -> None:
        self.checkpoint, self.out = checkpoint, out
        self.stopped = False
        """Stopped by the app (quitting): its result is not reported."""
        self.process = subprocess.Popen(export_command(checkpoint, out), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")

    def running(self) -> bool:
        return self.process.poll() is None

    def result(self) -> tuple[bool, str]:
        """Wait for it (blocking: call it in a worker). (ok, one line to show)."""
        stdout, stderr = self.process.communicate()
        said = [line.strip() for line in (stdout + "\n" + stderr).splitlines() if line.strip()]
        if self.process.returncode == 0:
            return True, f"wrote {self.out}" + (f": {said[-1]}" if said else "")
        errors = [line.strip() for line in stderr.splitlines() if line.strip()]
        reason = errors[-1] if errors else (said[-1] if said else "no output")
        return False, shortened(f"exit status {self.process.returncode}: {reason}", 400)

    def stop(self, grace: float = EXPORT_STOP_SECONDS) -> None:
        """End it and leave no partial output. SIGINT first: tideborn export takes it as Ctrl-C and removes
        its hidden temp file (tideborn.outputs.StagedOutputs; the ONNX file itself only ever appears whole,
        by rename). SIGKILL if it has not ended after `grace` seconds (deep in native code), and then its
        temp file is removed here, as the next export of that file would (`remove_stale_temps`)."""
        self.stopped = True
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        remove_stale_temps(self.out)


class ChoiceScreen(ModalScreen[str | None]):
    """What to do with a checkpoint: resume from it, export it, or nothing."""

    BINDINGS = [Binding("r", "choose('resume')", "Resume from it"), Binding("x", "choose('export')", "Export it"),
                Binding("escape,n", "choose('')", "Nothing")]

    def __init__(self, question: str, resume_refusal: str | None = None) -> None:
        super().__init__()
        self.question = question
        self.resume_refusal = resume_refusal
        """Why resuming does not work now (the run is live, no plan): r is then not offered."""

    def compose(self) -> ComposeResult:
        with Vertical(id="choice-box"):
            yield Static(self.question, id="choice-question", markup=False)
            if self.resume_refusal is not None:
                yield Static(Text(f"(no resuming: {self.resume_refusal})", style="dim"), id="choice-note")
            resume = "" if self.resume_refusal is not None else "[b]r[/b] resume the run from it    "
            yield Static(f"{resume}[b]x[/b] export it to ONNX    [b]Esc[/b] nothing", id="choice-keys")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "choose" and parameters == ("resume",) and self.resume_refusal is not None)

    def action_choose(self, what: str) -> None:
        self.dismiss(what or None)


class ExportScreen(ModalScreen[Path | None]):
    """The ONNX file to write (its directory must exist, as for `tideborn export --out`)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, checkpoint: CheckpointFile, suggestion: Path) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.suggestion = suggestion

    def compose(self) -> ComposeResult:
        with Vertical(id="export-box"):
            yield Static(f"Export {self.checkpoint.path.name} (step {self.checkpoint.step:,}) with tideborn export "
                         "(ONNX, checked against PyTorch) to:", markup=False)
            yield Input(str(self.suggestion), id="export-path")
            yield Static(id="export-error")

    def on_mount(self) -> None:
        self.query_one("#export-path", Input).focus()

    @on(Input.Submitted, "#export-path")
    def _submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            self.query_one("#export-error", Static).update(Text("give the ONNX file to write", style="bold red"))
            return
        out = Path(text).expanduser()
        if not out.is_absolute():
            out = Path.cwd() / out
        if not out.parent.is_dir():
            problem = f"{out.parent}: no such directory (tideborn export writes into an existing one)"
            self.query_one("#export-error", Static).update(Text(problem, style="bold red"))
            return
        try:
            check_output_before_work(out, "--out")  # what `tideborn export` would refuse, said before it starts
        except UserError as exc:
            self.query_one("#export-error", Static).update(Text(str(exc), style="bold red"))
            return
        self.dismiss(out)

    def action_cancel(self) -> None:
        self.dismiss(None)


class CheckpointScreen(Screen):
    """Opened from a run's dashboard; `status` gives the dashboard's latest status report (the eval box
    shows its `last_eval`, as `train_run status` does). Dismissed with the checkpoint to resume from."""

    HELP = ("The box at the top is the run's latest eval event, in the words train_run status prints. The "
            "checkpoints are the run's step-XXXXXXXXX.pt files, newest first (the one a plain start resumes from), "
            "with their size and age. Enter on one asks what to do with it; r resumes the run from it (train "
            "--resume, after the start checks and a y/n question; not while the run is live); x exports it to "
            "ONNX (tideborn export runs in the background; a notification says how it went; q while it runs "
            "asks, then stops it). Resuming from an older checkpoint abandons the newer ones: the trainer moves them "
            "to archive/branch-*.")
    BINDINGS = [
        Binding("r", "resume", "Resume from"),
        # While the run is live, or without a plan to start with, r is not offered; pressed, it says why.
        Binding("r", "resume_refused", "Resume from", show=False),
        Binding("x", "export", "Export"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, run_dir: Path, options: TuiOptions, status: typing.Callable[[], RunStatus | None],
                 can_start: typing.Callable[[], bool] = lambda: True) -> None:
        super().__init__()
        self.run_dir = run_dir
        self.options = options
        self.status_of = status
        self.can_start = can_start
        """Is there a plan to start with (--config, the editor's, launch.json)? Resuming needs one."""
        self.checkpoints: list[CheckpointFile] = []
        self._shown_status: RunStatus | None = None
        self._shown_files: list[CheckpointFile] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="ck-title")
        yield Static(id="evals")
        yield DataTable(id="checkpoints", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#checkpoints", DataTable)
        for label in ("checkpoint", "step", "size", "age", ""):
            table.add_column(label, key=label or "note")
        table.focus()
        self._refresh()
        self.set_interval(REFRESH_SECONDS, self._refresh)

    @property
    def state(self) -> str:
        status = self.status_of()
        return status.state if status is not None else "not started"

    def _refresh(self) -> None:
        status = self.status_of()
        if status is not self._shown_status:
            self._shown_status = status
            self._show_evals(status)
            self.refresh_bindings()  # r is offered by the run's state
        files = checkpoint_files(self.run_dir)
        if files != self._shown_files or files:  # ages move on: redraw the list while it has rows
            self._shown_files = files
            self._show_checkpoints(files, status)
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(" checkpoints and eval ", style="bold")
        title.append(f"{self.run_dir.name} ({self.state})")
        self.query_one("#ck-title", Static).update(title)

    def _show_evals(self, status: RunStatus | None) -> None:
        box = self.query_one("#evals", Static)
        last_eval = status.last_eval if status is not None else None
        if last_eval is None:
            box.border_title = "last eval: none"
            box.update(Text("no eval event yet (runtime.eval_every)", style="dim"))
            return
        when = last_eval.time
        age = f", {duration(self.options.clock() - when)} ago" if when is not None else ""
        box.border_title = f"last eval (as status shows it{age})"
        box.update(Text(eval_text(last_eval)))  # a Text: a hand-edited field's brackets are not markup

    def _show_checkpoints(self, files: list[CheckpointFile], status: RunStatus | None) -> None:
        table = self.query_one("#checkpoints", DataTable)
        highlighted = self.highlighted()
        table.clear()
        self.checkpoints = files
        now = self.options.clock()
        newest = status.last_checkpoint if status is not None else None
        changed = {Path(newest.path).name} if newest is not None and newest.changed_since_saved else set()
        for index, ck in enumerate(files):
            note = ""
            if index == 0:
                note = "newest"
            if ck.path.name in changed:  # status flags it: its size is not the one its checkpoint_saved recorded
                note += (", " if note else "") + "CHANGED since saved"
            table.add_row(ck.path.name, Text(f"{ck.step:,}", justify="right"),
                          Text(size_text(ck.size), justify="right"), f"{duration(now - ck.mtime)} ago", note,
                          key=str(ck.path))
        if files:
            steps = [ck.step for ck in files]
            row = steps.index(highlighted.step) if highlighted is not None and highlighted.step in steps else 0
            table.move_cursor(row=row)
        table.border_title = (f"{len(files)} checkpoints, newest first (a plain start resumes from the newest)"
                              if files else "no checkpoints yet")

    def highlighted(self) -> CheckpointFile | None:
        table = self.query_one("#checkpoints", DataTable)
        if not table.row_count or not self.checkpoints:
            return None
        row = table.cursor_row
        return self.checkpoints[row] if 0 <= row < len(self.checkpoints) else None

    # -- keys -----------------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "resume":
            return self.resume_refusal() is None
        if action == "resume_refused":
            return self.resume_refusal() is not None
        return True

    @on(DataTable.RowSelected, "#checkpoints")
    def _selected(self, event: DataTable.RowSelected) -> None:
        ck = self.highlighted()
        if ck is None:
            return

        def chosen(what: str | None) -> None:
            if what == "resume":
                self.action_resume()
            elif what == "export":
                self.action_export()

        self.app.push_screen(ChoiceScreen(f"{ck.path.name}: step {ck.step:,}, {size_text(ck.size)}, saved "
                                          f"{duration(self.options.clock() - ck.mtime)} ago", self.resume_refusal()),
                             chosen)

    def resume_refusal(self) -> str | None:
        state = self.state
        if state in LIVE_STATES:
            return f"the run is {state}: stop it first (x in the dashboard), then resume from a checkpoint"
        if not self.can_start():
            return (f"nothing to start: no launch.json in {self.run_dir} and no --config given (start the TUI "
                    "with --config FILE to resume from a checkpoint)")
        return None

    def action_resume_refused(self) -> None:
        self.notify(self.resume_refusal() or "", title="cannot resume", severity="warning", timeout=10)

    def action_resume(self) -> None:
        if (refusal := self.resume_refusal()) is not None:  # went live while the choice was open
            self.notify(refusal, title="cannot resume", severity="warning", timeout=10)
            return
        ck = self.highlighted()
        if ck is None:
            self.notify("no checkpoint to resume from", severity="warning", timeout=5)
            return
        self.dismiss(ck.path)  # the dashboard checks, asks and starts, as its start key does

    def action_export(self) -> None:
        ck = self.highlighted()
        if ck is None:
            self.notify("no checkpoint to export", severity="warning", timeout=5)
            return
        suggestion = Path.cwd() / f"{self.run_dir.name}-step-{ck.step:09d}.onnx"

        def chosen(out: Path | None) -> None:
            if out is not None:
                self.start_export(ck, out)

        self.app.push_screen(ExportScreen(ck, suggestion), chosen)

    def start_export(self, ck: CheckpointFile, out: Path) -> None:
        """`tideborn export` in a thread of the app's (it goes on, and reports, after this screen closes;
        quitting the app asks first, then stops it: see TidebornApp.action_quit)."""
        app = self.app
        try:
            job = ExportJob(ck.path, out)
        except OSError as exc:
            self.notify(f"cannot run tideborn export: {exc}", title="export failed", severity="error", timeout=20)
            return
        jobs = getattr(app, "exports", None)
        if jobs is not None:
            jobs.append(job)
        self.notify(f"exporting {ck.path.name} to {out}...", title="export", timeout=5)

        def export() -> None:
            ok, line = job.result()
            if jobs is not None and job in jobs:
                jobs.remove(job)
            if job.stopped:
                return  # stopped by quitting: nobody to tell
            try:
                app.call_from_thread(app.notify, line, title="export" if ok else "export failed",
                                     severity="information" if ok else "error", timeout=20)
            except RuntimeError:  # the app ended (a signal) while it ran: its output is on disk, whole
                return

        app.run_worker(export, thread=True, group="export", name=f"export {ck.path.name}")

    def action_back(self) -> None:
        self.dismiss(None)
