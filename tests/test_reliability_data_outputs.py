"""Teacher data under change and the data tools' outputs: what a user is left with when things go wrong.

A teacher file truncated while training reads it; `export`, `data convert` and `data split` writing
over things that are not regular files, under a permissive umask, onto a full disk, interrupted with
Ctrl-C or SIGKILL; a split interrupted between its two files; paths that name the same file twice.
"""

from __future__ import annotations

import os

import pytest
from conftest import REPO_ROOT, events_of, settings_args, terminal_events, wait_until
from test_data_support import hcpe_records, random_positions, write_records

from tideborn.data.records import RECORD_DTYPES

TEACHER_CONFIG = REPO_ROOT / "configs" / "smoke-teacher.toml"
HCPE_SIZE = RECORD_DTYPES["hcpe"].itemsize


# -- a teacher file truncated during training ----------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 1])
def test_a_teacher_file_truncated_during_training_fails_the_run_naming_it(tmp_path, start_trainer, workers):
    train_file = write_records(tmp_path / "data" / "train.hcpe", hcpe_records(random_positions(3000)))
    run_dir = tmp_path / "run"
    trainer = start_trainer("train", *settings_args(
        run_dir, f"paths.data_root={str(tmp_path / 'data')!r}", 'data.train=["train.hcpe"]', "data.test=[]",
        f"data.workers={workers}", "optim.batch_size=32", "runtime.max_steps=100000", "runtime.log_every=1",
        "runtime.eval_every=100000", "runtime.checkpoint_every=100000", 'runtime.progress="plain"',
        config=TEACHER_CONFIG))
    wait_until(lambda: any(e["kind"] == "step" for e in events_of(run_dir)), trainer, "the first step")
    # What a `cp other.hcpe train.hcpe` or a disk cleanup does under a running trainer: the file shrinks.
    os.truncate(train_file, 40 * HCPE_SIZE)

    status = trainer.wait()
    assert status == 2, trainer.output()  # a user error: one line, no traceback, no "Bus error"
    ended = terminal_events(events_of(run_dir))
    assert [e["kind"] for e in ended] == ["run_failed"], trainer.output()
    error = ended[0]["error"]
    assert str(train_file) in error and "changed while training read it" in error, error
    assert "1,520 bytes now" in error and "3,000 records" in error
    assert "Bus error" not in trainer.output() and "Traceback" not in trainer.output()
