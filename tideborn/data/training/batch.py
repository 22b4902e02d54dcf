"""A batch of training positions as the training loop takes it, from teacher data (`data.training.loader`) or
synthetic data (`trainer.synthetic`): input planes and the policy and value targets, as tensors; and
`BatchSource`, the one typed door through which the loop takes batches and asks about its data.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

import torch


@dataclass
class Batch:
    features1: torch.Tensor
    """[N, 62, 9, 9] float, binary planes."""
    features2: torch.Tensor
    """[N, 57, 9, 9] float, each plane all zeros or all ones."""
    policy: torch.Tensor
    """[N] int64 move labels in [0, 2187)."""
    value: torch.Tensor
    """[N] float value targets in [0, 1]."""
    policy_labels: torch.Tensor | None = None
    """[N, K] int64: with `policy_probs`, a policy target distribution per position (hcpe3 visit counts,
    averaged duplicates); None: `policy` is the one-hot target."""
    policy_probs: torch.Tensor | None = None
    """[N, K] float probabilities of `policy_labels` (rows sum to 1; padding has probability 0)."""
    result: torch.Tensor | None = None
    """[N] float game results (teacher data): with `eval_value`, what the trainer mixes when the mix decays."""
    eval_value: torch.Tensor | None = None
    """[N] float `sigmoid(eval / eval_scale)` (teacher data)."""

    def __len__(self) -> int:
        return int(self.policy.shape[0])


@dataclass(frozen=True)
class Hcpe3Note:
    """hcpe3 files among the positions: their games, and the positions left out as repetitions."""
    games: int
    repetitions_left_out: int


@dataclass(frozen=True)
class AverageNote:
    """`data.use_average`: the positions that went in, those left after merging, the duplicates merged, the
    records left out (an empty or illegal move) and the cache file the merged set is read from."""
    inputs: int
    positions: int
    merged: int
    skipped: int
    cache: str


@dataclass(frozen=True)
class WindowNote:
    """`data.watch` or `data.window_positions`: the files and positions in the window, and its generation."""
    files: int
    positions: int
    generation: int


@dataclass(frozen=True)
class DataSummary:
    """What the training positions are, for `run_started`'s `data` (`event_fields`, the same keys as ever)."""
    positions: int
    files: int
    kinds: tuple[str, ...]
    hcpe3: Hcpe3Note | None = None
    average: AverageNote | None = None
    window: WindowNote | None = None
    watch: bool = False

    def event_fields(self) -> dict:
        fields: dict = {"positions": self.positions, "files": self.files, "kinds": list(self.kinds)}
        for name in ("hcpe3", "average", "window"):
            part = getattr(self, name)
            if part is not None:
                fields[name] = dataclasses.asdict(part)
        if self.watch:
            fields["watch"] = True
        return fields


@dataclass(frozen=True)
class SkippedRecords:
    """Teacher records skipped so far (empty or illegal moves, `data.bad_records = "skip"`), counted across
    resumes, and the latest few as 'file: record N: reason'."""
    count: int = 0
    examples: tuple[str, ...] = ()


class WindowControl(typing.Protocol):
    """`data.watch`'s window as the training loop drives it (trainer/data_watch.py)."""

    rescan_seconds: float
    resume_left: list[tuple[str, str]]
    """Window files gone or changed since the checkpoint resumed from (they left; warnings)."""
    resume_moved: list[tuple[str, str]]
    """(old path, new path) of window files found under another name at resume (they kept their place)."""
    first_scan: typing.Any
    """The scan made when the data was opened (`data.training.watch.ScanResult`), reported as the run starts."""

    @property
    def joined_files(self) -> int: ...

    @property
    def window_positions(self) -> int: ...

    @property
    def waiting(self) -> bool: ...

    def unseen_files(self) -> list: ...

    def window_fields(self) -> dict: ...

    def rescan(self) -> typing.Any: ...


class BatchSource(typing.Protocol):
    """The one door between the training loop and its data: synthetic batches (`trainer.synthetic`) and teacher
    batches (`data.training.loader.TeacherBatches`) both implement it, and the loop asks nothing else of them."""

    record_draws: bool
    """Keep `drawn` (`runtime.ddp_diagnostics`' digest of the global batches)."""
    drawn: list
    """With `record_draws`: this rank's micro-batches since the list was last cleared, with their positions."""

    def next_batch(self) -> Batch: ...

    def state_dict(self) -> dict:
        """The data cursor, taken at a step boundary (what a checkpoint keeps)."""
        ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...

    @property
    def summary(self) -> DataSummary | None:
        """What the positions are (None for synthetic data)."""
        ...

    @property
    def scale_fits(self) -> typing.Sequence[typing.Any]:
        """`data.eval_scale_fit = "per_file"`: each training file's fitted eval scale (`data.sets.evalfix.ScaleFit`)."""
        ...

    @property
    def skipped(self) -> SkippedRecords: ...

    @property
    def window(self) -> WindowControl | None:
        """`data.watch`'s window, or None where the data is fixed."""
        ...

    def take_warnings(self) -> list[str]:
        """What opening the data found worth a warning event (a damaged or unusable cache), once each."""
        ...
