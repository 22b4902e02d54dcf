"""The data order: a seeded permutation per epoch, disjoint rank shards that cover the data, and a cursor
that resumes mid-epoch with exactly the batches an unbroken run would have read, workers or not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.data import hcpe_records, random_positions, settings_for, write_records
from tideborn.data.training.dataset import EpochPermutation, ShardedOrder
from tideborn.data.training.loader import TeacherBatches
from tideborn.errors import UserError
from tideborn.trainer.state import teacher_batches

CPU = torch.device("cpu")


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), seed=st.integers(0, 2**32), epoch=st.integers(0, 1000))
def test_each_epoch_order_is_a_permutation_of_all_records(n, seed, epoch):
    order = EpochPermutation(n, seed, epoch).permute(np.arange(n))
    assert np.array_equal(np.sort(order), np.arange(n))


def test_the_order_is_seeded_and_new_each_epoch():
    first = EpochPermutation(1000, 7, 0).permute(np.arange(1000))
    assert np.array_equal(first, EpochPermutation(1000, 7, 0).permute(np.arange(1000)))
    assert not np.array_equal(first, EpochPermutation(1000, 7, 1).permute(np.arange(1000)))
    assert not np.array_equal(first, EpochPermutation(1000, 8, 0).permute(np.arange(1000)))
    assert not np.array_equal(first, np.arange(1000))


@pytest.mark.parametrize("records, world_size, batch_size", [(105, 3, 7), (110, 3, 7), (64, 8, 8), (10, 4, 16)])
def test_rank_shards_are_disjoint_and_cover_the_epoch(records, world_size, batch_size):
    seen = []
    for rank in range(world_size):
        order = ShardedOrder(records, seed=3, batch_size=batch_size, rank=rank, world_size=world_size)
        seen.extend(np.concatenate([order.batch_indices(2, b) for b in range(order.batches_per_epoch)]).tolist())
    assert len(seen) == len(set(seen)), "a record was read by two ranks (or twice by one)"
    per_rank = records // world_size
    expected = world_size * (max(1, per_rank // batch_size) * batch_size if per_rank >= batch_size else per_rank)
    assert len(seen) == expected
    assert records - len(seen) < world_size * batch_size, "drop-last leaves less than one batch per rank"
    if records % (world_size * batch_size) == 0:
        assert sorted(seen) == list(range(records))


def _teacher_file(tmp_path, count=120, seed=0):
    return write_records(tmp_path / "train.hcpe", hcpe_records(random_positions(count, seed=seed), seed=seed))


def _read(data: TeacherBatches, batches: int) -> list[tuple]:
    out = []
    for _ in range(batches):
        batch = data.next_batch()
        out.append((batch.policy.tolist(), batch.value.tolist(), batch.features1.sum().item(),
                    batch.features2.sum().item()))
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_cursor_continues_with_the_same_batches(tmp_path, workers):
    _teacher_file(tmp_path)  # 120 records, batches of 16: 7 per epoch, so 12 batches cross an epoch
    settings = settings_for(tmp_path, f"data.workers={workers}", train=["train.hcpe"])
    with teacher_batches(settings, CPU) as unbroken:
        expected = _read(unbroken, 12)
    with teacher_batches(settings, CPU) as first:
        head = _read(first, 5)
        saved = first.state_dict()
    assert saved["epoch"] == 0 and saved["batch_in_epoch"] == 5 and saved["position"] == 5
    with teacher_batches(settings, CPU) as resumed:
        resumed.load_state_dict(saved)
        tail = _read(resumed, 7)
        assert resumed.state_dict()["epoch"] == 1
    assert head + tail == expected


def test_workers_deliver_what_the_training_process_would_decode(tmp_path):
    _teacher_file(tmp_path)
    with teacher_batches(settings_for(tmp_path, "data.workers=0", train=["train.hcpe"]), CPU) as inline:
        expected = _read(inline, 4)
    with teacher_batches(settings_for(tmp_path, "data.workers=2", "data.prefetch_batches=2",
                                     train=["train.hcpe"]), CPU) as workers:
        assert _read(workers, 4) == expected


def test_planes_packed_in_the_workers_arrive_bit_for_bit(tmp_path):
    """The packed planes a GPU run gets (eight to a byte, unpacked on the device; forced here on the CPU) are
    the planes the training process would decode itself, and so is the rest of the batch."""
    _teacher_file(tmp_path)
    with teacher_batches(settings_for(tmp_path, "data.workers=0", train=["train.hcpe"]), CPU) as inline:
        expected = [inline.next_batch() for _ in range(4)]
    with teacher_batches(settings_for(tmp_path, "data.workers=2", train=["train.hcpe"]), CPU,
                        pack_planes=True) as packed:
        assert packed.pack_planes
        got = [packed.next_batch() for _ in range(4)]
    for want, have in zip(expected, got, strict=True):
        assert have.features1.dtype == torch.float32 and have.features1.shape == want.features1.shape
        assert torch.equal(have.features1, want.features1) and want.features1.sum() > 0
        assert torch.equal(have.features2, want.features2) and torch.equal(have.policy, want.policy)
        assert torch.equal(have.value, want.value)


def test_rank_loaders_read_disjoint_records(tmp_path):
    positions = random_positions(96, seed=4)
    records = hcpe_records(positions)
    records["eval"] = np.arange(96) * 20 - 960  # a record's eval identifies it in its value target
    write_records(tmp_path / "train.hcpe", records)
    settings = settings_for(tmp_path, "loss.value_lambda=1.0", train=["train.hcpe"])
    values = []
    for rank in range(2):
        with teacher_batches(settings, CPU, rank=rank, world_size=2, micro_batch_size=16) as data:
            values.extend(v for _ in range(3) for v in data.next_batch().value.tolist())
    assert len(values) == 96 and len(set(np.round(np.array(values), 6))) == 96


def test_resuming_with_a_different_batch_size_is_refused(tmp_path):
    _teacher_file(tmp_path)
    with teacher_batches(settings_for(tmp_path, train=["train.hcpe"]), CPU) as data:
        data.next_batch()
        saved = data.state_dict()
    other = settings_for(tmp_path, "optim.batch_size=32", train=["train.hcpe"])
    with teacher_batches(other, CPU) as data, pytest.raises(UserError, match="the micro-batch size was 16"):
        data.load_state_dict(saved)


@pytest.mark.parametrize("workers", [0, 1])
def test_skipped_records_are_counted_and_named(tmp_path, workers):
    records = hcpe_records(random_positions(32, seed=2))
    records["bestMove16"][[3, 17]] = 0
    write_records(tmp_path / "train.hcpe", records)
    with teacher_batches(settings_for(tmp_path, f"data.workers={workers}", train=["train.hcpe"]), CPU) as data:
        sizes = [len(data.next_batch()) for _ in range(2)]
        assert sizes == [15, 15] or sorted(sizes) == [14, 16]
        assert data.skipped.count == 2
        assert all("train.hcpe: record " in text and "empty move" in text for text in data.skipped.examples)
        assert data.state_dict()["skipped_records"] == 2


@pytest.mark.parametrize("workers", [0, 1])
def test_bad_records_can_be_an_error_instead(tmp_path, workers):
    records = hcpe_records(random_positions(32, seed=2))
    records["bestMove16"][:] = 0
    write_records(tmp_path / "train.hcpe", records)
    settings = settings_for(tmp_path, f"data.workers={workers}", "data.bad_records=\"error\"", train=["train.hcpe"])
    with teacher_batches(settings, CPU) as data, pytest.raises(UserError, match=r"train\.hcpe: record \d+: empty move"):
        data.next_batch()


def test_data_without_a_usable_record_is_an_error_not_a_hang(tmp_path):
    records = hcpe_records(random_positions(48, seed=2))
    records["bestMove16"][:] = 0
    write_records(tmp_path / "train.hcpe", records)
    with teacher_batches(settings_for(tmp_path, train=["train.hcpe"]), CPU) as data, \
            pytest.raises(UserError, match=r"a whole epoch without a usable record \(48 skipped, e\.g\. .*empty move"):
        data.next_batch()
