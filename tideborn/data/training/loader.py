"""Teacher batches for the training loop: the same interface as `SyntheticBatches`, fed by worker processes.

`TeacherBatches(data, loader_settings, device, rank, world_size)`: the `[data]` settings and the few numbers the
loader needs from the rest (`LoaderSettings`), a `BatchSource` (`data.training.batch`): `next_batch() -> Batch` on
`device`, `state_dict()` / `load_state_dict()` with the data cursor, `close()`. Time spent inside
`next_batch()` is the data wait: with enough workers it is a queue pop and a host-to-device copy.

Workers are a `torch.utils.data.DataLoader` whose sampler yields this rank's cursors (epoch, global micro-batch)
of `GlobalOrder`: one global order whatever the world size, so a run resumes with other ranks where it was.
DataLoader brings what hand-rolled multiprocessing would have to rebuild: tensors cross processes through
shared memory rather than pickled bytes, batches come back in order whichever worker finished first, a
pin-memory thread stages them for asynchronous copies to CUDA, and workers are shut down (or their death
reported) for us. Workers send uint8 planes (see `features`); they are widened to float on the target
device. For a GPU the workers pack the 0/1 planes eight to a byte (`np.packbits`, about 0.3 ms a batch of
1024 in a worker) and the GPU unpacks them: 0.6 MB a batch instead of 5 MB crosses shared memory, the pinned
staging and the bus, which is what limited a fast GPU's data path (docs/benchmarks.md, the H200's data path).
"""

from __future__ import annotations

import os
import typing
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from tideborn.config.schema import DataSettings
from tideborn.data.decode.features import FEATURES1_NUM, BadRecord
from tideborn.data.sets.evalfix import ScaleFit, fit_files, scales_by_file
from tideborn.data.sets.sources import (
    BatchDecoder,
    TeacherSource,
    count_file,
    derived_files,
    open_source,
    training_source,
    watched_patterns,
)
from tideborn.data.training.batch import (
    AverageNote,
    Batch,
    DataSummary,
    Hcpe3Note,
    SkippedRecords,
    WindowControl,
    WindowNote,
)
from tideborn.data.training.dataset import GlobalOrder
from tideborn.data.training.watch import DataWatch, ScanResult, window_seed
from tideborn.errors import UserError

SKIP_EXAMPLES = 5
"""How many recently skipped records `skipped.examples` keeps for the warning event."""


class _DecodedBatches(Dataset):
    """Maps a cursor (epoch, batch) to that decoded batch; runs in the workers, which also work out the
    batch's record indices, so the training process does nothing per batch but receive it."""

    def __init__(self, records: TeacherSource, order: GlobalOrder, decoder_args: tuple, pack_planes: bool = False,
                 first: int = 0):
        self.records = records
        self.order = order
        self.first = first
        """The window's first position in `records` (`data.window_positions`): the order numbers the window."""
        self.decoder_args = decoder_args
        self.pack_planes = pack_planes
        self._decoder: BatchDecoder | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_decoder": None}

    def __len__(self) -> int:  # indexed by cursors from the sampler, never enumerated
        return len(self.records)

    def __getitem__(self, cursor: tuple[int, int]) -> dict:
        indices = self.order.micro_indices(*cursor) + self.first
        if self._decoder is None:
            self._decoder = BatchDecoder(*self.decoder_args)
        in_worker = torch.utils.data.get_worker_info() is not None
        return decode_indices(self.records, self._decoder, indices, in_worker, self.pack_planes and in_worker)


def _shared_zeros(shape: tuple[int, ...]) -> torch.Tensor:
    """A zeroed uint8 tensor in shared memory: it reaches the trainer process without a copy (what
    DataLoader's own collate does for batches built in workers)."""
    storage = torch.UntypedStorage._new_shared(int(np.prod(shape)))  # fresh shared pages are zero
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, shape)


def decode_indices(records: TeacherSource, decoder: BatchDecoder, indices: np.ndarray, in_worker: bool = False,
                   pack_planes: bool = False) -> dict:
    """Decode the records at `indices` into tensors. Errors come back as a message, not an exception:
    an exception raised in a worker would reach the trainer as a multi-line worker traceback. `pack_planes`:
    the board planes go packed eight to a byte (`features1_packed`, see `unpack_planes`)."""
    planes = _shared_zeros((len(indices), FEATURES1_NUM, 9, 9)) if in_worker and not pack_planes else None
    try:
        decoded = decoder.decode(records, indices, None if planes is None else planes.numpy())
    except BadRecord as bad:
        return {"error": f"{records.describe(int(indices[bad.position]))}: {bad.reason}"}
    except UserError as exc:  # a file that changed under the run (truncated, replaced), named by the reader
        return {"error": str(exc)}
    # The planes go as one shared-memory tensor; the small arrays as numpy, pickled by value through the
    # worker's queue (a tensor each would cost a file-descriptor handshake per batch).
    item = {
        "features1": torch.from_numpy(decoded.features1) if planes is None else planes[:len(decoded)],
        "features2": decoded.features2, "policy": decoded.policy, "value": decoded.value, "result": decoded.result,
        "eval_value": decoded.eval_value,
        "skipped": [(records.describe(int(indices[pos])), reason) for pos, reason in decoded.skipped],
    }
    if decoded.policy_probs is not None:  # a distribution target (hcpe3 visits, averaged duplicates)
        item["policy_labels"], item["policy_probs"] = decoded.policy_labels, decoded.policy_probs
    if pack_planes:
        bits = np.packbits(decoded.features1.reshape(len(decoded), -1), axis=1, bitorder="little")
        shared = _shared_zeros(bits.shape)
        shared.numpy()[:] = bits
        item["features1"], item["features1_packed"] = shared, True
    return item


_BIT_SHIFTS: dict[torch.device, torch.Tensor] = {}


def unpack_planes(packed: torch.Tensor) -> torch.Tensor:
    """[n, bytes] uint8 of `np.packbits(..., bitorder="little")` back to the [n, 62, 9, 9] 0/1 planes, as float,
    on the packed tensor's device (a few element-wise kernels on a GPU)."""
    shifts = _BIT_SHIFTS.get(packed.device)
    if shifts is None:
        shifts = _BIT_SHIFTS[packed.device] = torch.arange(8, dtype=torch.uint8, device=packed.device)
    n = packed.shape[0]
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    return bits.view(n, -1)[:, :FEATURES1_NUM * 81].float().view(n, FEATURES1_NUM, 9, 9)


def _as_decoded(item: dict) -> dict:
    """DataLoader's collate step, a no-op: its default would turn the numpy arrays into tensors."""
    return item


class _CursorSampler(Sampler):
    """This rank's endless cursors (epoch, global micro-batch) in data order, from the step starting at a given
    global cursor."""

    def __init__(self, order: GlobalOrder, epoch: int, micro: int):
        self.order, self.epoch, self.micro = order, epoch, micro

    def __iter__(self) -> typing.Iterator[tuple[int, int]]:
        return self.order.rank_cursors(self.epoch, self.micro)


@dataclass(frozen=True)
class LoaderSettings:
    """What the loader needs from outside `[data]` (the trainer makes it from the settings)."""

    data_root: str | os.PathLike
    """`paths.data_root`: where relative `data.train` paths resolve."""
    seed: int
    """`runtime.seed`: keys the data order."""
    micro_batch_size: int
    """Positions a micro-batch (`optim.micro_batch_size`)."""
    accumulation_steps: int
    """Micro-batches a rank takes per step (`optim.accumulation_steps`)."""
    value_lambda: float
    """`loss.value_lambda`: the mix of game result and eval in the value target."""
    value_lambda_decays: bool
    """The trainer mixes the value target itself (`loss.value_lambda_decay_steps`): batches carry both parts."""
    pin_memory: bool
    """`runtime.pin_memory`: stage CUDA batches in pinned memory."""


def pins_memory(device: torch.device, pin_memory: bool) -> bool:
    """Whether batches for `device` are staged in pinned memory (`runtime.pin_memory`, CUDA only)."""
    return device.type == "cuda" and pin_memory


def to_device_batch(item: dict, device: torch.device, pinned: bool = True, value_parts: bool = False) -> Batch:
    """Decoded uint8 planes to the float tensors the model takes, on `device`. On CUDA with `pinned`
    (`runtime.pin_memory`) the copies come from pinned memory and overlap the step.

    `features2` is the [n, 57] hand/check values broadcast to [n, 57, 9, 9] (a stride-0 view, so it is not
    copied twice: the training step materialises it once, contiguous or channels_last).
    """
    non_blocking = device.type == "cuda" and pinned
    planes, hands = torch.as_tensor(item["features1"]), torch.as_tensor(item["features2"])
    if item.get("features1_packed"):
        features1 = unpack_planes(_to_device(planes, device, non_blocking))
        hands = _to_device(hands, device, non_blocking).float()
    elif device.type == "cpu":
        # numpy widens in one pass; torch's threaded cast is several times slower on a busy 2-core host
        features1 = torch.from_numpy(planes.numpy().astype(np.float32))
        hands = torch.from_numpy(hands.numpy().astype(np.float32))
    else:
        # DataLoader pins the planes (a tensor); the small arrays arrive as numpy, which it leaves alone.
        # Whatever is not pinned yet is pinned here, so that every copy is asynchronous: a copy from
        # pageable memory can make the host wait for the GPU. (Pinned blocks come from torch's caching host
        # allocator, which reuses a block only once the copy that read it is done.)
        features1 = _to_device(planes, device, non_blocking).float()
        hands = _to_device(hands, device, non_blocking).float()
    n = hands.shape[0]
    features2 = hands.view(n, -1, 1, 1).expand(n, hands.shape[1], 9, 9)
    labels = probs = None
    if item.get("policy_probs") is not None:
        labels = _to_device(item["policy_labels"], device, non_blocking)
        probs = _to_device(item["policy_probs"], device, non_blocking)
    # `value_parts`: the result and eval parts of the value target too, which the trainer mixes itself when the
    # mix weight decays (loss.value_lambda_decay_steps); otherwise they are not copied.
    parts = [_to_device(item[key], device, non_blocking) if value_parts else None for key in ("result", "eval_value")]
    return Batch(features1, features2, _to_device(item["policy"], device, non_blocking),
                 _to_device(item["value"], device, non_blocking), labels, probs, *parts)


def _to_device(array: np.ndarray | torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
    tensor = torch.as_tensor(array)
    if non_blocking:
        return (tensor if tensor.is_pinned() else tensor.pin_memory()).to(device, non_blocking=True)
    return tensor.to(device)


class TeacherBatches:
    """An endless stream of teacher micro-batches for one rank (a `BatchSource`); resumable at any step boundary,
    at any world size (the cursor is the global one of `GlobalOrder`). `accumulation`: micro-batches a rank takes
    per step (default `accumulation_steps`). `source`: `data.train` as the trainer opened it (`data.training.opened`),
    taken over (closed with the loader); None: opened here. With `data.watch` it is its own `window`."""

    def __init__(self, data: DataSettings, loader_settings: LoaderSettings, device: torch.device, rank: int = 0,
                 world_size: int = 1, micro_batch_size: int | None = None, pack_planes: bool | None = None,
                 accumulation: int | None = None, source: TeacherSource | None = None):
        self.data, self.loader_settings = data, loader_settings
        self.device = torch.device(device)
        self.pinned = pins_memory(self.device, loader_settings.pin_memory)
        self.pack_planes = self.device.type == "cuda" if pack_planes is None else pack_planes
        """Workers pack the planes eight to a byte (module docstring): on CUDA, where the device unpacks them
        for nothing; on the CPU unpacking would cost more than the copy it saves. (An argument for the
        loader benchmark and the tests.)"""
        self._iterator: typing.Iterator | None = None
        self._loader: DataLoader | None = None
        self.resume_left: list[tuple[str, str]] = []
        self.resume_moved: list[tuple[str, str]] = []
        """With `data.watch`: window files found under another name at resume (they kept their place; notes)."""
        """With `data.watch`: window files gone or changed since the checkpoint (they left; warnings)."""
        self.kind = data.resolved_kind
        self.batch_size = micro_batch_size or loader_settings.micro_batch_size
        self.accumulation = accumulation or loader_settings.accumulation_steps
        """Micro-batches a rank takes per step."""
        self.rank, self.world_size = rank, world_size
        self.scale_fits: list[ScaleFit] = []
        """`data.eval_scale_fit = "per_file"`: each training file's eval scale (dlshogi's evalfix)."""
        self.first = 0
        """The window's first position in `records`: positions before it are older than the window."""
        self.watch: DataWatch | None = None
        """With `data.watch`: the joined files and the window (`data.watch`); `records` is the window's files."""
        self.records: TeacherSource | None = None
        self.order: GlobalOrder | None = None
        self.first_scan: ScanResult | None = None
        if data.watch:
            if world_size > 1:
                raise UserError("data.watch: a watched data set is trained by one process; run without torchrun")
            if source is not None:
                source.close()  # (nothing to take over: the window's files are opened as they join)
            self.watch = DataWatch(watched_patterns(data, loader_settings.data_root),
                                   lambda path: count_file(path, data.kind), data.window_positions,
                                   data.rescan_seconds, derived=lambda path: derived_files(path, data.kind))
            self.first_scan = self.watch.scan()
            self._open_window()
        else:
            records = source if source is not None else training_source(data, loader_settings.data_root)
            # fitted on the files as they are (before any averaging, which then uses each file's scale)
            self.scale_fits = fit_files(records, data.eval_scale) if data.eval_scale_fit == "per_file" else []
            self._use_records(records, [])
        self.decoder_args = (data.eval_scale, loader_settings.value_lambda, data.bad_records,
                             data.policy_temperature, None if data.use_average else scales_by_file(self.scale_fits))
        self.value_parts = loader_settings.value_lambda_decays
        self.epoch, self.micro = 0, 0
        """The global cursor at the start of the current step: (epoch, global micro-batch), the same on every rank."""
        self.micro_in_step = 0
        self.batches_delivered = 0
        self._skipped_count = 0
        """Records skipped so far (empty or illegal moves), counted across resumes."""
        self._skipped_examples: deque[str] = deque(maxlen=SKIP_EXAMPLES)
        """The latest skipped records as 'file: record N: reason', for the warning event."""
        self.record_draws = False
        """Keep `drawn`: for `runtime.ddp_diagnostics`' digest of the global batches."""
        self.drawn: list[tuple[tuple[int, int], np.ndarray]] = []
        """This rank's micro-batches since the list was last cleared: (epoch, global micro-batch), record indices."""

    def _use_records(self, records: TeacherSource, window: list) -> None:
        """Train on `records` (averaged first with `data.use_average`), the window's last `data.window_positions`
        of them, in a data order keyed by the seed and the watch's generation; the cursor starts over."""
        data = self.data
        if data.use_average:
            from tideborn.data.sets.average import averaged_source

            records = averaged_source(records, data, scales=scales_by_file(self.scale_fits))
        self.records = records
        # Averaged positions have no file order left: the window then holds the newest whole files (watch.window).
        self.first = 0
        if data.window_positions and len(records) > data.window_positions and not data.use_average:
            self.first = len(records) - data.window_positions
        positions = len(records) - self.first
        if positions < self.world_size:
            raise UserError(f"data.train: {positions} records cannot be shared among {self.world_size} ranks")
        if positions < self.world_size * self.accumulation:
            raise UserError(f"data.train: {positions} records cannot fill one step of {self.world_size} rank(s) "
                            f"x {self.accumulation} micro-batches (optim.accumulation_steps)")
        generation = self.watch.generation if self.watch is not None else 0
        seed = self.loader_settings.seed
        seed = seed if generation == 0 else window_seed(seed, generation)
        self.order = GlobalOrder(positions, seed, self.batch_size, self.world_size, self.accumulation, self.rank)
        if window:
            self.records.note["window"] = {"files": len(window), "positions": positions, "generation": generation}
        self.epoch, self.micro, self.micro_in_step = 0, 0, 0

    def _open_window(self) -> None:
        """The watch's window as the records (none while no file has joined); the cursor starts over."""
        assert self.watch is not None
        self._stop_workers()
        merged_before = None
        if self.records is not None:
            merged_before = self.records.note.get("average", {}).get("cache")
            self.records.close()
        self.records, self.order = None, None
        self.epoch, self.micro, self.micro_in_step = 0, 0, 0
        files, _ = self.watch.window()  # the cut is the same as `_use_records` makes
        if files:
            records = open_source([Path(f.path) for f in files], self.data.kind)
            self._use_records(records, files)
        merged_now = None if self.records is None else self.records.note.get("average", {}).get("cache")
        if merged_before is not None and merged_before != merged_now:
            # the merged set of a window that is no more: nothing reads it again (a resume rebuilds the one it needs)
            Path(merged_before).unlink(missing_ok=True)

    def rescan(self) -> ScanResult:
        """A rescan of the watched globs; a change of the window opens it anew (the data order starts over)."""
        assert self.watch is not None
        result = self.watch.scan()
        if result.changed:
            self._open_window()
        return result

    @property
    def window(self) -> WindowControl | None:
        """With `data.watch`, the loader itself: its window as the training loop drives it; else None."""
        return self if self.watch is not None else None

    @property
    def rescan_seconds(self) -> float:
        return self.data.rescan_seconds

    @property
    def joined_files(self) -> int:
        """Files that joined the watched set (in the window or older)."""
        return 0 if self.watch is None else len(self.watch.joined)

    def unseen_files(self) -> list[str]:
        """Files the watched globs match that have not joined (they join at the next rescan)."""
        return [] if self.watch is None else self.watch.unseen_files()

    @property
    def window_positions(self) -> int:
        return 0 if self.order is None else self.order.records

    @property
    def waiting(self) -> bool:
        """With `data.watch`: too few positions to train on yet (`data.window_min_positions`, or none at all)."""
        return self.order is None or self.window_positions < max(1, self.data.window_min_positions)

    def window_fields(self) -> dict:
        """The `data_window` event's facts about the window now."""
        assert self.watch is not None
        files, _ = self.watch.window()
        age = self.watch.newest_age_seconds()
        return {"files": len(self.watch.joined), "window_files": len(files), "positions": self.window_positions,
                "joined_positions": self.watch.total_positions, "window_limit": self.data.window_positions,
                "min_positions": self.data.window_min_positions, "waiting": self.waiting,
                "generation": self.watch.generation,
                "arrival_positions_per_hour": self.watch.arrival_positions_per_hour(),
                "newest_age_seconds": age}

    @property
    def summary(self) -> DataSummary:
        """What the training positions are, for `run_started`'s `data`: positions, files, kinds, hcpe3 games and
        repetitions left out, with `data.use_average` the averaging's inputs and merged count, and the window."""
        if self.records is None:
            return DataSummary(positions=0, files=0, kinds=(), watch=True)
        note = self.records.note
        hcpe3, average, window = note.get("hcpe3"), note.get("average"), note.get("window")
        return DataSummary(
            positions=int(note["positions"]), files=int(note["files"]), kinds=tuple(note["kinds"]),
            hcpe3=Hcpe3Note(**hcpe3) if hcpe3 is not None else None,
            average=AverageNote(**average) if average is not None else None,
            window=WindowNote(**window) if window is not None else None, watch=self.watch is not None)

    @property
    def skipped(self) -> SkippedRecords:
        return SkippedRecords(self._skipped_count, tuple(self._skipped_examples))

    def take_warnings(self) -> list[str]:
        """The cache warnings said in this process since last taken (`cachefile.take_cache_warnings`): those of
        opening this data (before the loader, `data.training.opened`, or in it: averaging, a watched window), once
        each."""
        from tideborn.data.cache.cachefile import take_cache_warnings

        return take_cache_warnings()

    @property
    def position(self) -> int:
        """Micro-batches delivered since step 0 (the same count `SyntheticBatches.position` keeps)."""
        return self.batches_delivered

    def _start(self) -> None:
        if self.records is None or self.order is None:
            raise UserError("data.train: the watched window holds no position yet (data.watch)")
        workers = self.data.workers
        if workers:
            # The workers fork from here (a fresh set each epoch): they inherit the compiled decoder loaded now
            # rather than each loading it again.
            from tideborn.data.decode import compiled  # here: only a run on teacher data needs the compiled loops
            compiled.prepare_decoder()
        dataset = _DecodedBatches(self.records, self.order, self.decoder_args, self.pack_planes, self.first)
        extra = {"prefetch_factor": self.data.prefetch_batches} if workers else {}
        self._loader = DataLoader(
            dataset, batch_size=None, sampler=_CursorSampler(self.order, self.epoch, self.micro),
            num_workers=workers, pin_memory=self.pinned, collate_fn=_as_decoded, **extra)
        self._iterator = iter(self._loader)

    def next_batch(self) -> Batch:
        empty_batches = 0
        while True:
            if self._iterator is None:
                self._start()
            assert self._iterator is not None
            item = next(self._iterator)
            if "error" in item:
                raise UserError(item["error"])
            if self.record_draws:
                cursor = self._cursor_of(self.micro_in_step)
                self.drawn.append((cursor, self.order.micro_indices(*cursor)))
            self._advance()
            self.batches_delivered += 1
            for where, reason in item["skipped"]:
                self._skipped_count += 1
                self._skipped_examples.append(f"{where}: {reason}")
            if item["policy"].shape[0]:
                return to_device_batch(item, self.device, self.pinned, self.value_parts)
            # every record of this batch was skipped: take the next one rather than train on nothing
            empty_batches += 1
            if empty_batches >= self.order.micros_per_epoch // self.order.world_size:
                raise UserError(f"data.train: a whole epoch without a usable record ({self._skipped_count} "
                                f"skipped, e.g. {self._skipped_examples[-1]})")

    def _cursor_of(self, micro_in_step: int) -> tuple[int, int]:
        epoch, micro = self.order.step_start(self.epoch, self.micro)
        return epoch, micro + micro_in_step * self.order.world_size + self.order.rank

    def _advance(self) -> None:
        """One micro-batch delivered; after the step's last, the global cursor moves on by a global batch."""
        self.micro_in_step += 1
        if self.micro_in_step == self.order.accumulation:
            epoch, micro = self.order.step_start(self.epoch, self.micro)
            self.epoch, self.micro = self.order.step_start(epoch, micro + self.order.micros_per_step)
            self.micro_in_step = 0

    @property
    def batch_in_epoch(self) -> int:
        """The global cursor's micro-batch within its epoch (the checkpoint's name for it)."""
        return self.micro

    def state_dict(self) -> dict:
        """The global cursor, taken at a step boundary (where the trainer saves)."""
        state = {
            "kind": self.kind, "order": "global", "epoch": self.epoch, "batch_in_epoch": self.micro,
            "position": self.batches_delivered, "skipped_records": self._skipped_count,
            "records": self.window_positions, "batch_size": self.batch_size,
            "world_size": self.world_size, "global_batch": self.batch_size * self.world_size * self.accumulation,
            "seed": self.loader_settings.seed, "use_average": self.data.use_average,
        }
        if self.watch is not None:
            state["watch"] = self.watch.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved cursor, at any world size. The order is only the same for the same records,
        seed and micro-batch size, so a change in any of them is an error rather than a silent reshuffle."""
        if self.watch is not None:
            if "watch" not in state:
                raise UserError("cannot resume the data order: the checkpoint was written without data.watch; train "
                                "the watched set in a new run directory (--mode finetune with run.init_checkpoint)")
            self.resume_left = self.watch.load_state_dict(state["watch"])
            self.resume_moved = self.watch.resume_moved
            self._open_window()
            if self.resume_left:  # the window changed: its order starts over, as at any change
                self.batches_delivered = int(state.get("position", 0))
                self._skipped_count = int(state.get("skipped_records", 0))
                return
        expected = {"kind": self.kind, "use_average": self.data.use_average,
                    "records": self.window_positions, "batch_size": self.batch_size, "seed": self.loader_settings.seed}
        names = {"kind": "data.kind", "use_average": "data.use_average", "records": "data.train's record count",
                 "batch_size": "the micro-batch size", "seed": "runtime.seed"}
        for key, now in expected.items():
            if key in state and state[key] != now:
                hint = ("; the files data.train names changed (new files under a glob?): restore them, or train on "
                        "the new set from this checkpoint in a new run directory (--mode finetune with "
                        "run.init_checkpoint)") if key == "records" else ""
                raise UserError(f"cannot resume the data order: {names[key]} was {state[key]!r} when the "
                                f"checkpoint was written and is {now!r} now{hint}")
        self._stop_workers()
        micro = int(state["batch_in_epoch"])
        if state.get("order") != "global":
            # Written before the order was global: its cursor counted each rank's micro-batches, and micro-batch j
            # of all its ranks together covered global micro-batches j * world_size ... on.
            micro *= int(state.get("world_size", 1))
        self.epoch, self.micro = int(state["epoch"]), micro
        if self.order is not None:
            self.epoch, self.micro = self.order.step_start(self.epoch, self.micro)
        self.micro_in_step = 0
        self.batches_delivered = int(state.get("position", 0))
        self._skipped_count = int(state.get("skipped_records", 0))

    def _stop_workers(self) -> None:
        iterator, self._iterator, self._loader = self._iterator, None, None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def close(self) -> None:
        """Stop the worker processes (safe to call more than once; the next `next_batch` restarts them)."""
        self._stop_workers()
        if self.records is not None:
            self.records.close()

    def __enter__(self) -> TeacherBatches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

