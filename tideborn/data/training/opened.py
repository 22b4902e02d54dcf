"""A run's teacher data opened once: the training and held-out sources, hcpe3 files decoded into their caches
and the train/test pairing checked, handed on to the loader and the evaluator rather than opened again.

Light to import (the readers load only when `open_data` runs): a run on synthetic data never pays for them.
"""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass

if typing.TYPE_CHECKING:
    from tideborn.config.schema import DataSettings
    from tideborn.data.sets.sources import TeacherSource


@dataclass(frozen=True)
class OpenedData:
    """The sources a run reads: `train` (None for synthetic data, and with `data.watch`, whose files come and
    go while the run goes on) and `test` (None without `data.test`). Whoever takes one closes it."""

    train: TeacherSource | None = None
    test: TeacherSource | None = None

    def close(self) -> None:
        """Release what is open (a source reopens its files if read again)."""
        for source in (self.train, self.test):
            if source is not None:
                source.close()


def open_data(data: DataSettings, data_root: str | os.PathLike,
              warn: typing.Callable[[str], None] | None = None) -> OpenedData:
    """`data.train` and `data.test` opened (hcpe3 files decoded into their caches, a malformed game named) and
    checked as a pair (`game_index.check_pairs`); `UserError` for anything the trainer refuses."""
    if data.resolved_kind == "synthetic":
        return OpenedData()
    from tideborn.data.formats.game_index import check_pairs
    from tideborn.data.sets.sources import held_out_source, training_source

    train = None if data.watch else training_source(data, data_root, warn)
    try:
        test = held_out_source(data, data_root, warn)
    except BaseException:
        if train is not None:
            train.close()
        raise
    opened = OpenedData(train, test)
    try:
        check_pairs(train.paths if train is not None else [], test.paths if test is not None else [])
    except BaseException:
        opened.close()
        raise
    return opened
