"""Hostile filesystems and bad input: a run directory someone else controls, one that cannot be written,
and settings files and options that are odd in other ways.

Someone else's run directory: a symbolic link planted at a run file (`.trainer.lock`, `events.jsonl`,
`archive`) must never be written, moved or deleted through, and a directory (or a run file) owned by
another user, or writable by others, is refused. An impossible `runtime.out_dir` (a read-only mount, a
path under a regular file, a name too long, a full disk, another user's directory) is one line and exit
status 2 from `train` and `train_run start`, and a notice from the TUI's start key, which keeps running.

This machine's tests run as root. Another user is simulated with `os.chown` to an unused uid, and, where
root would bypass the permission checks, by running the trainer as `nobody` through `setpriv`; read-only
and full filesystems are real tmpfs mounts. Each of these is skipped where it is not permitted.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import pytest

from tests.helpers.common import (
    REPO_ROOT,
    SMOKE_CONFIG,
    assert_user_error,
    child_env,
    copy_run,
    describe,
    out_dir_set,
    run_trainer,
    settings_args,
    tree,
)
from tests.helpers.reliability import tmpfs, tool
from tideborn.config.load import load_settings
from tideborn.errors import UserError
from tideborn.rundir.access import check_run_dir
from tideborn.rundir.events import EventWriter
from tideborn.rundir.layout import list_checkpoints
from tideborn.safefile import open_run_file, write_atomically

OTHER_UID = 4242
"""A uid no account on a test machine uses: "another user"."""
QUICK = ("runtime.max_steps=2", "optim.batch_size=16", "runtime.progress=plain")
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="making files of another user needs root")


def train_in(run_dir: Path | str, *extra: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_trainer("train", *settings_args(Path(run_dir), *QUICK), *extra, cwd=cwd)


def start_in(run_dir: Path | str, cwd: Path) -> subprocess.CompletedProcess:
    return tool("start", *settings_args(Path(run_dir), *QUICK), cwd=cwd)


def assert_nothing_launched(place: Path, result: subprocess.CompletedProcess | None = None) -> None:
    """No train.pid anywhere under `place`: no trainer was launched."""
    launched = list(place.rglob("train.pid")) if place.is_dir() else []
    assert not launched, describe(result) if result is not None else launched


def as_nobody_available() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                            "import tideborn.trainer.cli"], env=child_env(), cwd=REPO_ROOT, capture_output=True)
    return probe.returncode == 0


def train_as_nobody(run_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    """`train` as the unprivileged user nobody (root would pass every permission check)."""
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
               "tideborn.trainer", "train", *settings_args(run_dir, *QUICK)]
    return subprocess.run(command, cwd=cwd, env=child_env({"HOME": str(cwd)}), capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside every run directory that a planted link points at; it must stay as it is."""
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


# -- must 1: links and owners ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [".trainer.lock", "events.jsonl"])
def test_train_never_writes_through_a_planted_link(tmp_path: Path, victim: Path, name: str) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / name).symlink_to(victim)
    result = train_in(run_dir, cwd=tmp_path)
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, rf"{name} is a symbolic link \(to {victim}\).*never writes")
    assert victim.read_text() == "precious\n"
    assert list_checkpoints(run_dir) == []


@pytest.mark.parametrize("name", [".trainer.lock", "events.jsonl", "train.log"])
def test_train_run_start_never_writes_through_a_planted_link(tmp_path: Path, victim: Path, name: str) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / name).symlink_to(victim)
    result = start_in(run_dir, cwd=tmp_path)
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, rf"{name} is a symbolic link")
    assert victim.read_text() == "precious\n"
    assert_nothing_launched(run_dir, result)


def test_fresh_never_moves_the_run_through_a_linked_archive(tmp_path: Path, template_run: Path) -> None:
    run_dir = copy_run(template_run, tmp_path / "run")
    outside = tmp_path / "outside"
    outside.mkdir()
    (run_dir / "archive").symlink_to(outside, target_is_directory=True)
    before = {name: (run_dir / name).read_bytes() for name in ("events.jsonl", "step-000000004.pt")}
    result = train_in(run_dir, "--fresh", cwd=tmp_path)
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, r"archive is a symbolic link")
    assert tree(outside) == {}  # nothing was carried out of the run directory
    assert {name: (run_dir / name).read_bytes() for name in before} == before


def test_run_files_are_never_opened_through_a_link(tmp_path: Path, victim: Path) -> None:
    """The file opens themselves refuse a link (O_NOFOLLOW), whatever checks ran before them."""
    link = tmp_path / "events.jsonl"
    link.symlink_to(victim)
    with pytest.raises(UserError, match="is a symbolic link"):
        open_run_file(link, os.O_WRONLY | os.O_APPEND)
    with pytest.raises(UserError, match="is a symbolic link"):
        EventWriter(link)
    planted = tmp_path / f".train.pid.tmp-{os.getpid()}"  # the temp name write_atomically is about to use
    planted.symlink_to(victim)
    with pytest.raises(UserError, match="is a symbolic link"):
        write_atomically(tmp_path / "train.pid", lambda handle: handle.write(b"{}"))
    assert victim.read_text() == "precious\n" and planted.is_symlink() and not (tmp_path / "train.pid").exists()


@AS_ROOT
def test_a_run_directory_writable_by_the_owners_own_group_is_fine(tmp_path: Path) -> None:
    """umask 002 with user private groups (Debian, Ubuntu) makes directories 0775: the group is the
    owner alone, so that is not "writable by others"."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o775)  # root's group is root's own here
    check_run_dir(run_dir)
    os.chown(run_dir, -1, OTHER_UID)
    with pytest.raises(UserError, match=r"writable by others \(mode 775\)"):
        check_run_dir(run_dir)


def test_a_link_to_a_run_directory_of_ones_own_is_fine(tmp_path: Path) -> None:
    real = tmp_path / "big-disk" / "run"
    real.mkdir(parents=True)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "run").symlink_to(real, target_is_directory=True)
    check_run_dir(tmp_path / "runs" / "run")  # no error


def make_other_users_dir(path: Path, mode: int = 0o755) -> Path:
    path.mkdir()
    os.chown(path, OTHER_UID, OTHER_UID)
    path.chmod(mode)
    return path


@AS_ROOT
def test_a_run_directory_another_user_made_in_shared_tmp_is_refused(tmp_path: Path, victim: Path) -> None:
    """The case this is all about: in a world-writable /tmp, another user prepares the run directory
    (with a link where the lock goes) before the trainer, running as root here, arrives."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    run_dir = make_other_users_dir(shared / "run")
    (run_dir / ".trainer.lock").symlink_to(victim)
    os.lchown(run_dir / ".trainer.lock", OTHER_UID, OTHER_UID)
    for result in (train_in(run_dir, cwd=tmp_path), start_in(run_dir, cwd=tmp_path)):
        assert result.returncode == 2, describe(result)
        assert_user_error(result.stderr, rf"the run directory {run_dir} belongs to uid {OTHER_UID}, and you are "
                                         r"root \(uid 0\).*yours alone")
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in run_dir.iterdir()) == [".trainer.lock"]


def _others_file(run_dir: Path) -> str:
    (run_dir / "events.jsonl").write_text("")
    os.chown(run_dir / "events.jsonl", OTHER_UID, OTHER_UID)
    (run_dir / "events.jsonl").chmod(0o600)
    return rf"the file {run_dir}/events.jsonl belongs to uid {OTHER_UID}"


def _world_writable_dir(run_dir: Path) -> str:
    run_dir.chmod(0o777)
    return rf"the run directory {run_dir} is writable by others \(mode 777\).*chmod go-w"


def _group_writable_file(run_dir: Path) -> str:
    (run_dir / "train.log").write_text("")
    os.chown(run_dir / "train.log", -1, OTHER_UID)  # a group others are in (not the owner's private group)
    (run_dir / "train.log").chmod(0o664)
    return r"the file .*train.log is writable by others \(mode 664\)"


@AS_ROOT
@pytest.mark.parametrize("spoil", [_others_file, _world_writable_dir, _group_writable_file])
def test_a_run_directory_others_can_change_is_refused(tmp_path: Path, spoil) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pattern = spoil(run_dir)
    before = tree(run_dir)
    for result in (train_in(run_dir, cwd=tmp_path), start_in(run_dir, cwd=tmp_path)):
        assert result.returncode == 2, describe(result)
        assert_user_error(result.stderr, pattern)
    assert tree(run_dir) == before


# -- must 6: an out_dir that cannot be written ----------------------------------------------------------------

def _under_a_file(tmp_path: Path, stack: contextlib.ExitStack) -> tuple[Path, str]:
    (tmp_path / "plain-file").write_text("not a directory\n")
    return tmp_path / "plain-file" / "run", r"plain-file is a file, not a directory"


def _name_too_long(tmp_path: Path, stack: contextlib.ExitStack) -> tuple[Path, str]:
    return tmp_path / ("n" * 300) / "run", r"too long for the filesystem .*300 bytes"


def _read_only_mount(tmp_path: Path, stack: contextlib.ExitStack) -> tuple[Path, str]:
    mount = stack.enter_context(tmpfs(tmp_path / "ro", "size=1m"))
    (mount / "old-run").mkdir()  # a run directory from before the filesystem went read-only
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    return mount / "old-run", r"cannot write in .*old-run: the filesystem is mounted read-only \[EROFS\]"


def _full_disk(tmp_path: Path, stack: contextlib.ExitStack) -> tuple[Path, str]:
    mount = stack.enter_context(tmpfs(tmp_path / "full", "size=64k"))
    with open(mount / "filler", "wb") as filler:
        with contextlib.suppress(OSError):  # ENOSPC: full, as wanted
            filler.write(b"\0" * (1 << 20))
    return mount / "run", r"cannot create .*run in .*full: no space left on the device \[ENOSPC\]"


def _other_users_private_dir(tmp_path: Path, stack: contextlib.ExitStack) -> tuple[Path, str]:
    if os.geteuid() != 0:
        pytest.skip("making a directory of another user needs root")
    return make_other_users_dir(tmp_path / "theirs", 0o700), rf"belongs to uid {OTHER_UID}"


def _other_users_private_files(tmp_path: Path, stack: contextlib.ExitStack) -> tuple[Path, str]:
    if os.geteuid() != 0:
        pytest.skip("making files of another user needs root")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("events.jsonl", "train.log", "step-000000002.pt"):
        (run_dir / name).write_bytes(b"")
        os.chown(run_dir / name, OTHER_UID, OTHER_UID)
        (run_dir / name).chmod(0o600)
    return run_dir, rf"belongs to uid {OTHER_UID}"


IMPOSSIBLE = [_under_a_file, _name_too_long, _read_only_mount, _full_disk, _other_users_private_dir,
              _other_users_private_files]


@pytest.mark.parametrize("make", IMPOSSIBLE)
def test_train_and_start_refuse_an_impossible_out_dir_in_one_line(tmp_path: Path, make) -> None:
    with contextlib.ExitStack() as stack:
        run_dir, pattern = make(tmp_path, stack)
        for result in (train_in(run_dir, cwd=tmp_path), start_in(run_dir, cwd=tmp_path)):
            assert result.returncode == 2, describe(result)
            assert_user_error(result.stderr, pattern)
            assert_nothing_launched(tmp_path, result)
        assert not [p.name for p in tmp_path.rglob(".tideborn-write-probe-*")]  # the probe left nothing


@pytest.fixture
def open_tmp() -> typing.Iterator[Path]:
    """A scratch directory the user nobody can reach (pytest's own are inside a 0700 directory of root's)."""
    path = Path(tempfile.mkdtemp(prefix="tideborn-hostile-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.mark.skipif(not as_nobody_available(), reason="needs root, setpriv, and a tree the user nobody can read")
def test_an_unprivileged_trainer_is_told_why_it_cannot_write(open_tmp: Path) -> None:
    """Root passes every permission check, so the unwritable cases a real user meets run as nobody."""
    tmp_path = open_tmp
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # root's 0700 directory: nobody may not even look in
    (private / "run").mkdir()
    result = train_as_nobody(private / "run", cwd=tmp_path)
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, r"cannot write in .*private/run: permission denied \[EACCES\]")
    roots = tmp_path / "roots-run"  # readable by all, but root's
    roots.mkdir(mode=0o755)
    result = train_as_nobody(roots, cwd=tmp_path)
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, r"belongs to root \(uid 0\), and you are nobody \(uid 65534\)")
    mine = tmp_path / "nobodys-run"  # nobody's own run directory, with a log it may not write
    mine.mkdir()
    (mine / "train.log").write_text("")
    (mine / "train.log").chmod(0o444)
    os.chown(mine, 65534, 65534)
    os.chown(mine / "train.log", 65534, 65534)
    result = train_as_nobody(mine, cwd=tmp_path)
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, r"cannot write .*train.log: permission denied \(mode 444\)")


@pytest.mark.parametrize("make", [_under_a_file, _read_only_mount, _name_too_long])
async def test_the_monitors_start_key_shows_the_error_and_keeps_running(tmp_path: Path, make) -> None:
    from textual.notifications import Notify

    from tideborn.tui.app import create_app
    from tideborn.tui.options import TuiOptions
    from tideborn.tui.plan import LaunchPlan
    from tideborn.tui.screens.confirm import ConfirmScreen
    from tideborn.tui.screens.dashboard import DashboardScreen

    with contextlib.ExitStack() as stack:
        run_dir, pattern = make(tmp_path, stack)
        plan = LaunchPlan(config=str(SMOKE_CONFIG), overrides=(out_dir_set(run_dir), *QUICK), cwd=tmp_path)
        app = create_app(TuiOptions(run_dir=run_dir, plan=plan, use_nvml=False, follow=False))
        seen: list = []
        async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
            await pilot.pause(0.2)
            await pilot.press("s")
            for _ in range(200):
                errors = [m.notification for m in seen if isinstance(m, Notify)
                          and m.notification.title == "cannot start"]
                if errors:
                    break
                if isinstance(app.screen, ConfirmScreen):  # where start asks first: say yes
                    await pilot.press("y")
                await pilot.pause(0.05)
            assert errors, [m.notification.message for m in seen if isinstance(m, Notify)]
            assert re.search(pattern, errors[0].message), errors[0].message
            assert "\n" not in errors[0].message
            assert app.is_running and isinstance(app.screen, DashboardScreen)
            await pilot.press("question_mark")  # still answering keys
            await pilot.pause()
            assert not isinstance(app.screen, DashboardScreen)
        assert_nothing_launched(tmp_path)


# -- small: BOM, huge strings, stop --timeout -----------------------------------------------------------------

@pytest.mark.parametrize(("name", "text"), [("settings.toml", '[optim]\nlr = 0.125\n'),
                                            ("settings.json", '{"optim": {"lr": 0.125}}')])
def test_a_settings_file_with_a_byte_order_mark_is_read(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_settings(path, environ={}, cwd=tmp_path).settings.optim.lr == 0.125
    project = tmp_path / "tideborn.toml"  # the project file too
    project.write_bytes(b"\xef\xbb\xbf[optim]\nlr = 0.25\n")
    assert load_settings(None, environ={}, cwd=tmp_path).settings.optim.lr == 0.25


HUGE = 50_000_000


@pytest.mark.parametrize("item", [f"optim.lr={'x' * HUGE}", f"runtime.device={'x' * HUGE}",
                                  f"optim.{'x' * HUGE}=1", f"{'x' * HUGE}.lr=1", f'run.network="{"x" * HUGE}"'],
                         ids=["bad-value", "bad-choice", "bad-key", "bad-section", "bad-network"])
def test_an_error_about_a_huge_string_does_not_echo_it(item: str) -> None:
    with pytest.raises(UserError) as caught:
        load_settings(None, [item], environ={})
    message = str(caught.value)
    assert len(message) < 2_000, len(message)
    assert "x..." in message or "x'..." in message
    assert f"{HUGE:,} characters" in message


def test_an_integer_past_pythons_digit_limit_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"--set runtime.max_steps=1+\.\.\. \(5,018 characters\): an integer has "
                                        r"more than 4,300 digits"):
        load_settings(None, [f"runtime.max_steps={'1' * 5000}"], environ={})
    path = tmp_path / "big.toml"
    path.write_text(f"[runtime]\nmax_steps = {'1' * 5000}\n")
    with pytest.raises(UserError, match=r"big.toml: an integer has more than"):
        load_settings(path, environ={})


def test_a_huge_value_from_the_command_line_is_one_short_line(tmp_path: Path) -> None:
    value = "y" * 100_000  # as long as one argument may be
    result = run_trainer("config", "--set", f"optim.lr={value}", cwd=tmp_path)
    assert result.returncode == 2, describe(result)
    line = assert_user_error(result.stderr, r"is not a TOML value")
    assert len(line) < 1_000 and "(100,009 characters)" in line


@pytest.mark.parametrize("timeout", ["-1", "nan", "-inf"])
def test_stop_refuses_a_negative_or_nan_timeout(tmp_path: Path, timeout: str) -> None:
    result = tool("stop", "--out-dir", str(tmp_path), f"--timeout={timeout}")
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, rf"--timeout: must be 0 or more seconds, got '{timeout}'")


@pytest.mark.parametrize("wait", ["-1", "nan"])
def test_start_refuses_a_negative_or_nan_wait_and_launches_nothing(tmp_path: Path, wait: str) -> None:
    run_dir = tmp_path / "run"
    result = tool("start", *settings_args(run_dir), f"--wait={wait}")
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, rf"--wait: must be 0 or more seconds, got '{wait}'")
    assert not run_dir.exists()


def test_a_short_value_is_quoted_whole() -> None:
    """The cut is only for long strings: ordinary messages keep their whole value."""
    with pytest.raises(UserError, match=r"--set optim.lr=fast: 'fast' is not a TOML value"):
        load_settings(None, ["optim.lr=fast"], environ={})


@pytest.mark.parametrize("command", ["status", "stop", "watch"])
def test_the_run_tools_read_an_out_dir_with_a_name_too_long_as_no_run(tmp_path: Path, command: str) -> None:
    result = tool(command, "--out-dir", str(tmp_path / ("n" * 300)))
    assert result.returncode == 3, describe(result)
    assert_user_error(result.stderr, r"File name too long")
