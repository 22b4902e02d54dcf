"""dlshogi's compiled loader (`cppshogi`, built from its public source) driven for the hcpe3 benchmark.

Not a dependency: `load_cppshogi` loads the module from a build folder the user names (`bench_hcpe3`'s
`--dlshogi-build`; its `--help` says how to build it).
"""

from __future__ import annotations

import importlib.util
import sys
import time
import types
from pathlib import Path

import numpy as np

from tideborn.errors import UserError

DLSHOGI_POLICY = 27 * 81
DLSHOGI_FEATURES = (62, 57)
"""dlshogi's input planes as built by default (without NYUGYOKU_FEATURES): the same as cshogi's."""
HCPE = np.dtype([("hcp", np.uint8, 32), ("eval", np.int16), ("bestMove16", np.uint16), ("gameResult", np.uint8),
                 ("dummy", np.uint8)])
"""dlshogi's HuffmanCodedPosAndEval record (38 bytes), as its `dlshogi.common` spells it."""


def load_cppshogi(build: Path) -> types.ModuleType:
    """dlshogi's compiled `cppshogi` module from a built source tree (or a folder holding the .so)."""
    found = sorted(build.glob("dlshogi/cppshogi*.so")) or sorted(build.glob("cppshogi*.so"))
    if not found:
        raise UserError(f"--dlshogi-build {build}: no cppshogi*.so there or in {build / 'dlshogi'}; build it "
                        f"with `python setup.py build_ext --inplace` in dlshogi's source tree (see --help)")
    spec = importlib.util.spec_from_file_location("cppshogi", found[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:  # built for another Python or numpy
        raise UserError(f"{found[0]}: cannot load ({exc}); build it with this Python ({sys.version.split()[0]})") \
            from None
    return module


class DlshogiData:
    """A file loaded with dlshogi's `load_hcpe3` (temperature 1, evals as written, duplicates averaged only
    with `use_average`), and batches decoded by its `hcpe3_decode_with_value` into preallocated arrays.
    The module keeps what it loaded in globals: one file per process."""

    def __init__(self, cppshogi: types.ModuleType, path: Path, batch_size: int, use_average: bool = False):
        self.cppshogi = cppshogi
        started, cpu_started = time.perf_counter(), time.process_time()
        total, read = cppshogi.load_hcpe3(str(path), use_average, 0.0, 1.0)
        self.load_seconds = time.perf_counter() - started
        self.load_cpu_seconds = time.process_time() - cpu_started
        # `total` counts entries (merged ones once, with use_average); `read` the positions read
        self.positions, self.read = total, read
        if not use_average and total != read:
            raise UserError(f"{path}: dlshogi's module already held {total - self.positions} positions; "
                            "load one file per process")
        self.features1 = np.zeros((batch_size, DLSHOGI_FEATURES[0], 9, 9), np.float32)
        self.features2 = np.zeros((batch_size, DLSHOGI_FEATURES[1], 9, 9), np.float32)
        self.probability = np.zeros((batch_size, DLSHOGI_POLICY), np.float32)
        self.result = np.zeros(batch_size, np.float32)
        self.value = np.zeros(batch_size, np.float32)

    def decode(self, indices: np.ndarray) -> int:
        n = len(indices)
        self.cppshogi.hcpe3_decode_with_value(np.ascontiguousarray(indices, dtype=np.uint64), self.features1[:n],
                                              self.features2[:n], self.probability[:n], self.result[:n],
                                              self.value[:n])
        return n

    def hcp(self, index: int) -> bytes:
        """The packed position of entry `index` (through `hcpe3_get_hcpe`)."""
        record = np.zeros(38, np.uint8)
        self.cppshogi.hcpe3_get_hcpe(index, record)
        return record[:32].tobytes()


def dlshogi_figures(build: Path, path: Path, batch_size: int, batches: int, seed: int) -> dict:
    """Load `path` with dlshogi's module in this process and time batches in a shuffled order, as its
    `Hcpe3DataLoader` draws them (`np.arange` shuffled)."""
    data = DlshogiData(load_cppshogi(build), path, batch_size)
    if data.positions == 0:
        raise UserError(f"{path}: dlshogi reads no position from it")
    order = np.random.default_rng(seed).permutation(data.positions).astype(np.uint64)

    def batch(b: int) -> np.ndarray:  # wraps around a file smaller than the batches asked for
        return order[np.arange(b * batch_size, (b + 1) * batch_size) % data.positions]

    data.decode(batch(0))  # first touch of the arrays and the threads is not throughput
    started, cpu_started = time.perf_counter(), time.process_time()
    positions = 0
    for b in range(1, batches + 1):
        positions += data.decode(batch(b))
    seconds = time.perf_counter() - started
    return {"load_seconds": data.load_seconds, "load_cpu_seconds": data.load_cpu_seconds, "positions": data.positions,
            "positions_per_second": positions / seconds,
            "positions_per_cpu_second": positions / (time.process_time() - cpu_started)}


def dump_dlshogi_average(build: Path, path: Path, out: Path, batch_size: int = 512) -> None:
    """Every entry of `path` loaded with dlshogi's `use_average`, decoded, saved to `out` (.npz): hcp,
    result, value, and the nonzero distribution entries as (entry, label, probability)."""
    data = DlshogiData(load_cppshogi(build), path, batch_size, use_average=True)
    hcp = np.zeros((data.positions, 32), np.uint8)
    result = np.zeros(data.positions, np.float32)
    value = np.zeros(data.positions, np.float32)
    entries, labels, probabilities = [], [], []
    for start in range(0, data.positions, batch_size):
        n = data.decode(np.arange(start, min(start + batch_size, data.positions), dtype=np.uint64))
        rows, columns = np.nonzero(data.probability[:n])
        entries.append(rows + start)
        labels.append(columns)
        probabilities.append(data.probability[:n][rows, columns])
        result[start:start + n], value[start:start + n] = data.result[:n], data.value[:n]
        for k in range(n):
            hcp[start + k] = np.frombuffer(data.hcp(start + k), np.uint8)
    np.savez(out, hcp=hcp, result=result, value=value, read=data.read, entry=np.concatenate(entries),
             label=np.concatenate(labels), probability=np.concatenate(probabilities))


def dlshogi_hcpe_figures(build: Path, path: Path, batch_size: int, batches: int, seed: int) -> dict:
    """dlshogi's hcpe training path on `path` in this process: the records read into memory and shuffled (its
    `DataLoader` shuffles the whole array each epoch, untimed here), then `hcpe_decode_with_value` on
    consecutive slices into preallocated arrays, as its `mini_batch` does: float planes zeroed and filled, move
    labels, results and values."""
    cppshogi = load_cppshogi(build)
    started = time.perf_counter()
    records = np.fromfile(path, dtype=HCPE)
    np.random.default_rng(seed).shuffle(records)
    load_seconds = time.perf_counter() - started
    if len(records) == 0:
        raise UserError(f"{path}: no hcpe record in it")
    features1 = np.zeros((batch_size, DLSHOGI_FEATURES[0], 9, 9), np.float32)
    features2 = np.zeros((batch_size, DLSHOGI_FEATURES[1], 9, 9), np.float32)
    move = np.zeros(batch_size, np.int64)
    result = np.zeros(batch_size, np.float32)
    value = np.zeros(batch_size, np.float32)

    def decode(b: int) -> int:  # wraps around a file smaller than the batches asked for
        start = (b * batch_size) % max(1, len(records) - batch_size)
        batch = records[start:start + batch_size]
        n = len(batch)
        cppshogi.hcpe_decode_with_value(batch, features1[:n], features2[:n], move[:n], result[:n], value[:n])
        return n

    decode(0)  # first touch of the arrays is not throughput
    started, cpu_started = time.perf_counter(), time.process_time()
    positions = sum(decode(b) for b in range(1, batches + 1))
    return {"load_seconds": load_seconds, "positions": len(records),
            "positions_per_second": positions / (time.perf_counter() - started),
            "positions_per_cpu_second": positions / (time.process_time() - cpu_started)}
