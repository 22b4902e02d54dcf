"""The global data order: one stream of positions whatever the world size, a cursor that means the same at any
world size, `optim.global_batch_size` split among the processes (or refused), the warning when the batch is per
process and the world size changes on resume, and the digest of the global batches under runtime.ddp_diagnostics.
All in-process: the world size is what `prepare` and the data streams are given."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.common import SMOKE_CONFIG, events_of, step_events, train
from tests.helpers.data import hcpe_records, random_positions, settings_for, write_records
from tideborn.config.load import load_settings
from tideborn.data.training.dataset import GlobalOrder
from tideborn.data.training.loader import TeacherBatches
from tideborn.errors import UserError
from tideborn.trainer.distributed import global_batch_digest
from tideborn.trainer.loop import prepare
from tideborn.trainer.rank import DistEnv
from tideborn.trainer.state import teacher_batches
from tideborn.trainer.synthetic import SyntheticBatches

CPU = torch.device("cpu")
TINY = ("run.network=\"resnet2x32\"", "model.blocks=1", "model.channels=8", "runtime.log_every=1",
        "runtime.progress=\"plain\"")


def _step_records(order_of_rank, steps: int) -> list[list[int]]:
    """Each step's global batch as the ranks' micro-batches, in global order."""
    ranks = [order.rank_cursors(0, 0) for order in order_of_rank]
    micros_per_step = order_of_rank[0].micros_per_step
    out = []
    for _ in range(steps):
        drawn = sorted(next(cursors) for cursors in ranks for _ in range(order_of_rank[0].accumulation))
        assert len(drawn) == micros_per_step
        out.append([int(i) for cursor in drawn for i in order_of_rank[0].micro_indices(*cursor)])
    return out


@pytest.mark.parametrize("world_size, accumulation", [(2, 2), (4, 1)])
def test_every_world_size_reads_the_same_global_batches(world_size, accumulation):
    # 4 micro-batches of 8 a step: one process with 4 of them, or the ranks each with their share.
    single = _step_records([GlobalOrder(100, 5, 8, 1, 4)], steps=9)  # 3 steps an epoch: crosses two epochs
    ranks = [GlobalOrder(100, 5, 8, world_size, accumulation, rank) for rank in range(world_size)]
    assert _step_records(ranks, steps=9) == single
    assert all(len(set(batch)) == 32 for batch in single)
    epoch = [i for batch in single[:3] for i in batch]
    assert len(set(epoch)) == 96  # an epoch is whole steps: 3 of 32, 4 records dropped
    assert single[3] != single[0]  # and the next epoch is in another order


def test_a_cursor_written_at_another_global_batch_starts_the_next_epoch_when_no_step_fits():
    order = GlobalOrder(100, 5, 8, 2, 2)  # 32 a step, 12 micro-batches an epoch
    assert order.step_start(0, 8) == (0, 8)
    assert order.step_start(0, 10) == (1, 0)  # 10 + 4 > 12
    small = GlobalOrder(10, 5, 8, 2, 1)  # fewer records than one global batch: one step of short micro-batches
    assert small.micro_size == 5 and small.micros_per_epoch == 2
    with pytest.raises(ValueError, match="cannot be shared among 4 ranks x 3"):
        GlobalOrder(10, 5, 8, 4, 3)


def test_teacher_batches_resume_at_another_world_size_in_the_same_global_sequence(tmp_path):
    records = hcpe_records(random_positions(150, seed=3), seed=3)
    write_records(tmp_path / "train.hcpe", records)
    settings = settings_for(tmp_path, train=["train.hcpe"])

    def draws(data: TeacherBatches, micros: int) -> list[int]:
        data.record_draws = True
        for _ in range(micros):
            data.next_batch()
        found = [int(i) for _, ids in sorted(data.drawn, key=lambda d: d[0]) for i in ids]
        data.drawn.clear()
        return found

    # One process: 2 micro-batches of 16 a step, 5 steps (crossing the epoch: 4 steps of 32 in 150 records).
    with teacher_batches(settings, CPU, accumulation=2) as single:
        expected = draws(single, 10)
    # Two ranks, 1 micro-batch each a step, for 2 steps; rank 0's cursor saved, then one process goes on.
    pieces = []
    saved = None
    rank_data = [teacher_batches(settings, CPU, rank=r, world_size=2, accumulation=1) for r in range(2)]
    for data in rank_data:
        data.record_draws = True
    for _ in range(2):
        for data in rank_data:
            data.next_batch()
    pieces += [int(i) for _, ids in sorted([d for data in rank_data for d in data.drawn], key=lambda d: d[0])
               for i in ids]
    saved = rank_data[0].state_dict()
    assert rank_data[1].state_dict()["batch_in_epoch"] == saved["batch_in_epoch"] == 4  # the same on every rank
    for data in rank_data:
        data.close()
    with teacher_batches(settings, CPU, accumulation=2) as resumed:
        resumed.load_state_dict(saved)
        pieces += draws(resumed, 6)
    assert pieces == expected


def test_a_cursor_from_before_the_global_order_is_read_as_its_global_position(tmp_path):
    write_records(tmp_path / "train.hcpe", hcpe_records(random_positions(150, seed=3), seed=3))
    settings = settings_for(tmp_path, train=["train.hcpe"])
    old = {"kind": "hcpe", "epoch": 0, "batch_in_epoch": 2, "position": 2, "records": 150, "batch_size": 16,
           "world_size": 2, "seed": settings.runtime.seed, "use_average": False, "skipped_records": 0}
    with teacher_batches(settings, CPU) as data:
        data.load_state_dict(old)
        assert (data.epoch, data.micro) == (0, 4)  # 2 micro-batches of each of 2 ranks


def test_the_synthetic_cursor_is_global():
    ranks = [SyntheticBatches(1, 4, CPU, rank, 2) for rank in range(2)]
    for data in ranks:
        for _ in range(3):
            data.next_batch()
    state = ranks[0].state_dict()
    assert state["global_position"] == 6
    one = SyntheticBatches(1, 4, CPU)
    one.load_state_dict(state)
    assert torch.equal(one.next_batch().policy, SyntheticBatches(1, 4, CPU).make(6).policy)
    old = SyntheticBatches(1, 4, CPU)
    old.load_state_dict({"kind": "synthetic", "position": 3, "batch_size": 4, "world_size": 2})
    assert old.global_position == 6


def _resolved(run_dir, *sets):
    return load_settings(SMOKE_CONFIG, [f"runtime.out_dir={str(run_dir)!r}", *TINY, *sets], environ={},
                         cwd=run_dir.parent)


def test_global_batch_size_derives_the_per_process_batch_and_refuses_a_world_size_that_cannot_split_it(tmp_path):
    sets = ("optim.batch_size=16", "optim.global_batch_size=64")
    one = prepare(_resolved(tmp_path / "a", *sets), argv=[])
    assert (one.settings.optim.batch_size, one.settings.optim.accumulation_steps) == (64, 4)
    two = prepare(_resolved(tmp_path / "a", *sets), argv=[], env=DistEnv(0, 0, 2))
    assert (two.settings.optim.batch_size, two.settings.optim.accumulation_steps) == (32, 2)
    assert two.settings.optim.micro_batch_size == 16
    with pytest.raises(UserError, match=r"^--set optim.global_batch_size: 64 positions a step cannot be split among "
                                        r"3 process\(es\) in micro-batches of 16"):
        prepare(_resolved(tmp_path / "a", *sets), argv=[], env=DistEnv(0, 0, 3))
    assert not (tmp_path / "a").exists()  # refused before anything was written
    with pytest.raises(Exception, match="must be a multiple of the micro-batch"):
        _resolved(tmp_path / "a", "optim.batch_size=16", "optim.global_batch_size=40")


@pytest.fixture(scope="module")
def per_rank_run(tmp_path_factory):
    """Two steps at world size 1 with the batch per process (the default), a checkpoint at step 2."""
    root = tmp_path_factory.mktemp("per-rank")
    train(root / "run", *TINY, "optim.batch_size=16", "runtime.max_steps=2", "runtime.checkpoint_every=2", cwd=root)
    return root / "run"


def test_resuming_at_another_world_size_with_a_per_process_batch_warns_and_scales_nothing(per_rank_run):
    resolved = load_settings(SMOKE_CONFIG, [f"runtime.out_dir={str(per_rank_run)!r}", *TINY, "optim.batch_size=16",
                                            "runtime.max_steps=4"], environ={}, cwd=per_rank_run.parent)
    prepared = prepare(resolved, argv=[], env=DistEnv(0, 0, 2))
    assert prepared.start.step == 2
    assert prepared.settings.optim.batch_size == 16 and prepared.settings.optim.lr == resolved.settings.optim.lr
    [warning] = [w for w in prepared.start.warnings if "world size" in w]
    assert "at world size 2, written at 1" in warning
    assert "the global batch is now 32 positions a step, not 16" in warning
    same = prepare(resolved, argv=[])
    assert not [w for w in same.start.warnings if "world size" in w]


@pytest.fixture(scope="module")
def digest_runs(tmp_path_factory):
    """A straight run of 4 steps and one stopped at step 2 and resumed, both logging batch digests."""
    root = tmp_path_factory.mktemp("digests")
    sets = (*TINY, "optim.batch_size=8", "optim.global_batch_size=16", "runtime.ddp_diagnostics=true",
            "runtime.max_steps=4", "runtime.checkpoint_every=2")
    train(root / "straight", *sets, cwd=root)
    train(root / "pieces", *sets, cwd=root, extra=("--stop-at-step", "2"))
    train(root / "pieces", *sets, cwd=root)
    return root


def _digests(run_dir) -> dict[int, str]:
    return {event["step"]: event["batch_digests"][-1] for event in step_events(events_of(run_dir))}


def test_the_step_events_carry_a_digest_of_each_global_batch_that_a_resume_continues(digest_runs):
    straight = _digests(digest_runs / "straight")
    assert sorted(straight) == [1, 2, 3, 4] and len(set(straight.values())) == 4
    assert _digests(digest_runs / "pieces") == straight


def test_the_digest_is_the_same_for_the_global_batch_dealt_to_two_ranks(digest_runs):
    straight = _digests(digest_runs / "straight")
    seed = events_of(digest_runs / "straight")[0]["settings"]["runtime"]["seed"]
    ranks = [SyntheticBatches(seed, 8, CPU, rank, 2) for rank in range(2)]
    for data in ranks:
        data.record_draws = True
    two = {}
    for step in range(1, 5):
        for data in ranks:
            data.drawn.clear()
            data.next_batch()
        two[step] = global_batch_digest([d for data in ranks for d in data.drawn], DistEnv())
    assert two == straight
