"""The README's teacher data commands run as written, on the shipped games, in a copy of a fresh clone."""

from __future__ import annotations

import shutil
import subprocess

from tests.helpers.common import REPO_ROOT, events_of
from tests.helpers.readme import activated_env, teacher_block


def test_the_readme_teacher_data_commands_run_as_written_on_the_shipped_games(tmp_path):
    """As in a fresh clone: only what git tracks (samples/, configs/) and no ../shared beside it."""
    clone = tmp_path / "clone"
    clone.mkdir()
    for tracked in ("samples", "configs"):
        shutil.copytree(REPO_ROOT / tracked, clone / tracked)
    env = activated_env()
    for command in teacher_block():
        done = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"`{command}` exited {done.returncode}: {done.stderr[-2000:]}"
    events = events_of(clone / "runs" / "ckpt" / "smoke-teacher")
    evals = [e for e in events if e["kind"] == "eval"]
    assert evals and evals[-1]["step"] == 300 and evals[-1]["positions"] > 500
    assert evals[-1]["policy_accuracy"] > 1 / 2187
