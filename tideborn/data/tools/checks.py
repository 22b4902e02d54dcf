"""`inspect` and `verify`: what is in teacher files, and whether every record of them is usable.

inspect reads only the fixed fields (vectorised, fast); verify decodes every record with cshogi, as
training would, and adds the checks training skips for speed (impossible material, eval range).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import cshogi
import numpy as np

from tideborn.data.decode.features import (
    Decoder,
    evals_for_side_to_move,
    packed_positions,
    record_problems,
    results_for_side_to_move,
    stored_move,
)
from tideborn.data.formats.game_index import (
    index_mismatch,
    index_path,
    partner_of,
    read_index,
    read_index_header,
    split_mismatch,
)
from tideborn.data.formats.records import (
    RECORD_DTYPES,
    ChangedWhileRead,
    open_record_file,
    readable_size,
    size_problem,
    stream_records,
)
from tideborn.data.tools.progress import CountProgress
from tideborn.errors import UserError

CHUNK = 65536
EVAL_EDGES = [-32768, -3000, -1000, -300, -100, 100, 300, 1000, 3000, 32768]
"""Eval histogram bins (side to move's view); the middle bin [-100, 100) holds the unscored zeros too."""


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def packed_hashes(packed: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
    """A 64-bit hash of each 32-byte packed position (and of `extra`, e.g. the move), for duplicates."""
    words = np.ascontiguousarray(packed).view(np.uint64).reshape(len(packed), 4)
    with np.errstate(over="ignore"):
        h = np.zeros(len(packed), dtype=np.uint64)
        for column in range(4):
            h = _mix(h ^ words[:, column] ^ np.uint64(column + 1))
        if extra is not None:
            h = _mix(h ^ extra.astype(np.uint64))
    return h


@dataclass
class FileSummary:
    path: str
    kind: str
    records: int = 0
    bytes: int = 0
    results: dict = field(default_factory=dict)
    """Counts of the stored result, by name."""
    side_to_move: dict = field(default_factory=dict)
    """win / draw / loss counts for the side to move."""
    evals_zero: int = 0
    eval_histogram: list = field(default_factory=list)
    eval_min: int = 0
    eval_max: int = 0
    plies: dict | None = None
    """min/max plies and where they come from (psv gamePly, or the hcpe's game index), None if unknown."""
    duplicate_positions: int = 0
    """Records whose position (packed bytes) occurred before, in this file."""
    duplicate_records: int = 0
    """Records identical in position and move to an earlier one, in this file."""
    problem: str | None = None


def summarise(path: Path, kind: str, progress: CountProgress | None = None, done_before: int = 0
              ) -> tuple[FileSummary, np.ndarray, np.ndarray]:
    """The file's summary and its position and record hashes (for duplicates across files)."""
    size = readable_size(path, kind)
    summary = FileSummary(str(path), kind, bytes=size)
    problem = size_problem(size, kind)
    if problem:
        summary.problem = problem
        return summary, np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    summary.records = n = size // RECORD_DTYPES[kind].itemsize
    result_field = "gameResult" if kind == "hcpe" else "game_result"
    names = ({cshogi.BLACK_WIN: "black_win", cshogi.WHITE_WIN: "white_win", cshogi.DRAW: "draw"} if kind == "hcpe"
             else {1: "win", 0: "draw", -1: "loss"})
    stored_counts: dict = {}
    stm = np.zeros(3, np.int64)
    histogram = np.zeros(len(EVAL_EDGES) - 1, np.int64)
    position_hashes, record_hashes = [], []
    ply_min, ply_max = None, None
    summary.eval_min, summary.eval_max = 32767, -32768
    for start, chunk in stream_records(path, kind, n, CHUNK):  # read, not mapped: see stream_records
        values, counts = np.unique(chunk[result_field].astype(np.int64), return_counts=True)
        for value, count in zip(values.tolist(), counts.tolist()):
            name = names.get(value, f"out of range ({value})")
            stored_counts[name] = stored_counts.get(name, 0) + count
        result = results_for_side_to_move(chunk, kind)
        stm += [(result == 1).sum(), (result == 0.5).sum(), (result == 0).sum()]
        evals = evals_for_side_to_move(chunk, kind).astype(np.int64)
        summary.evals_zero += int((evals == 0).sum())
        histogram += np.histogram(evals, bins=EVAL_EDGES)[0]
        summary.eval_min = min(summary.eval_min, int(evals.min()))
        summary.eval_max = max(summary.eval_max, int(evals.max()))
        packed = packed_positions(chunk)
        position_hashes.append(packed_hashes(packed))
        record_hashes.append(packed_hashes(packed, stored_move(chunk, kind)))
        if kind == "psv":
            plies = chunk["gamePly"].astype(np.int64)
            ply_min = int(plies.min()) if ply_min is None else min(ply_min, int(plies.min()))
            ply_max = int(plies.max()) if ply_max is None else max(ply_max, int(plies.max()))
        if progress is not None:
            progress.update(done_before + start + len(chunk))
    summary.results = stored_counts
    summary.side_to_move = dict(zip(("win", "draw", "loss"), stm.tolist()))
    summary.eval_histogram = histogram.tolist()
    if kind == "psv":
        summary.plies = {"min": ply_min, "max": ply_max, "from": "gamePly"}
    elif index_path(path).is_file():
        try:
            games = read_index(index_path(path), n)
            lengths = [g.plies for g in games]
            summary.plies = {"min": min(lengths), "max": max(lengths), "games": len(games), "from": "game index"}
        except UserError as exc:
            summary.plies = {"error": str(exc)}
    positions = np.concatenate(position_hashes)
    moves = np.concatenate(record_hashes)
    summary.duplicate_positions = n - len(np.unique(positions))
    summary.duplicate_records = n - len(np.unique(moves))
    return summary, positions, moves


def inspect_files(paths: list[Path], kind: str, progress: bool = True) -> dict:
    """Summaries of `paths` and, for several files, the totals with duplicates counted across files."""
    sizes = [readable_size(p, kind) for p in paths]
    total_records = sum(s // RECORD_DTYPES[kind].itemsize for s in sizes)
    bar = CountProgress("inspect", total_records, "records", enabled=progress)
    summaries, all_positions, all_records, done = [], [], [], 0
    for path in paths:
        summary, positions, records = summarise(path, kind, bar, done)
        done += summary.records
        summaries.append(summary)
        all_positions.append(positions)
        all_records.append(records)
    bar.finish()
    report: dict = {"kind": kind, "files": [vars(s) for s in summaries]}
    if len(paths) > 1:
        positions, records = np.concatenate(all_positions), np.concatenate(all_records)
        report["total"] = {"records": int(len(positions)),
                           "duplicate_positions": int(len(positions) - len(np.unique(positions))),
                           "duplicate_records": int(len(records) - len(np.unique(records)))}
    return report


def _percent(count: int, total: int) -> str:
    return f"{100 * count / total:.1f}%" if total else "-"


def format_inspection(report: dict) -> str:
    lines = []
    for f in report["files"]:
        if f["problem"]:
            lines.append(f"{f['path']}: {f['kind']}, {f['problem']}")
            continue
        n = f["records"]
        lines.append(f"{f['path']}: {f['kind']}, {n:,} records ({f['bytes']:,} bytes)")
        stored = ", ".join(f"{name} {count:,} ({_percent(count, n)})" for name, count in f["results"].items())
        lines.append(f"  results:        {stored}")
        stm = f["side_to_move"]
        lines.append("  side to move:   " + ", ".join(f"{k} {_percent(v, n)}" for k, v in stm.items()))
        lines.append(f"  eval:           {f['evals_zero']:,} zero ({_percent(f['evals_zero'], n)}), "
                     f"range {f['eval_min']}..{f['eval_max']}")
        bins = []
        for (low, high), count in zip(zip(EVAL_EDGES, EVAL_EDGES[1:]), f["eval_histogram"]):
            label = f"<{high}" if low == EVAL_EDGES[0] else (f">={low}" if high == EVAL_EDGES[-1] else f"{low}..{high}")
            bins.append(f"{label}: {count:,}")
        lines.append("  eval histogram: " + ", ".join(bins))
        plies = f["plies"]
        if plies is None:
            lines.append("  plies:          unknown (hcpe records store no ply, and there is no game index)")
        elif "error" in plies:
            lines.append(f"  plies:          unknown ({plies['error']})")
        else:
            games = f", {plies['games']:,} games" if "games" in plies else ""
            lines.append(f"  plies:          {plies['min']}..{plies['max']} (from {plies['from']}{games})")
        lines.append(f"  duplicates:     {f['duplicate_positions']:,} positions seen before "
                     f"({_percent(f['duplicate_positions'], n)}), {f['duplicate_records']:,} identical records")
    if "total" in report:
        t = report["total"]
        lines.append(f"all files: {t['records']:,} records; {t['duplicate_positions']:,} positions seen before "
                     f"({_percent(t['duplicate_positions'], t['records'])}), "
                     f"{t['duplicate_records']:,} identical records")
    return "\n".join(lines)


@dataclass
class BadRecordReport:
    path: str
    index: int | None
    """Record index in the file; None for a problem with the whole file."""
    reason: str

    def __str__(self) -> str:
        where = self.path if self.index is None else f"{self.path}: record {self.index}"
        return f"{where}: {self.reason}"


def pair_problems(path: Path) -> list[str]:
    """What is wrong with `path`'s game index: written for another version of the file, or naming as its
    partner a file from another split (see `game_index`)."""
    found = []
    if (mismatch := index_mismatch(path)) is not None:
        found.append(mismatch)
    header = read_index_header(index_path(path))
    partner = None if header is None else partner_of(path, header)
    if partner is not None and partner.is_file():
        if (mixed := split_mismatch(path, partner)) is not None:
            found.append(mixed)
    return found


def verify_files(paths: list[Path], kind: str, progress: bool = True) -> tuple[int, list[BadRecordReport]]:
    """(records checked, problems found). Missing, directory or unreadable files raise `UserError`."""
    sizes = [readable_size(p, kind) for p in paths]
    itemsize = RECORD_DTYPES[kind].itemsize
    bar = CountProgress("verify", sum(s // itemsize for s in sizes), "records", enabled=progress)
    decoder = Decoder(kind, eval_scale=1.0, value_lambda=0.0)
    problems: list[BadRecordReport] = []
    checked = 0
    for path, size in zip(paths, sizes):
        problem = size_problem(size, kind)
        if problem:
            problems.append(BadRecordReport(str(path), None, problem))
            if size < itemsize:
                continue
        problems.extend(BadRecordReport(str(path), None, text) for text in pair_problems(path))
        for start, chunk in stream_records(path, kind, size // itemsize, CHUNK):  # read, not mapped
            for i, reason in record_problems(chunk, kind, decoder):
                problems.append(BadRecordReport(str(path), start + i, reason))
            checked += len(chunk)
            bar.update(checked, f"{len(problems):,} bad")
    bar.finish()
    return checked, problems


def summarise_hcpe3(path: Path, progress: bool = True) -> dict:
    """An hcpe3 file's games, positions and search data (decoding it, through its positions cache)."""
    from tideborn.data.cache.hcpe3 import RESULT_FLAGS, RESULT_MASK, Hcpe3File

    bar = CountProgress("inspect", readable_size(path, "hcpe3"), "bytes", enabled=progress)
    positions = Hcpe3File(path).positions(progress=lambda done, total: bar.update(done))
    bar.finish()
    n = len(positions)
    game_ids = np.asarray(positions.game)
    # game headers: read back from the file at the indexed offsets (the positions cache keeps the offsets)
    headers = _hcpe3_headers(path, np.asarray(positions.game_offsets))
    results = headers["result"].astype(np.int64)
    stored = results & RESULT_MASK
    names = {cshogi.BLACK_WIN: "black_win", cshogi.WHITE_WIN: "white_win", cshogi.DRAW: "draw"}
    by_result = {name: int((stored == value).sum()) for value, name in names.items()}
    flags = {name: int((results & bit).astype(bool).sum()) for name, bit in RESULT_FLAGS.items()}
    opponents = {str(k): int(v) for k, v in zip(*np.unique(headers["opponent"], return_counts=True))}
    move_nums = headers["moveNum"].astype(np.int64)
    counts = np.diff(np.asarray(positions.cand_offsets))
    visits = np.asarray(positions.cand_visits).astype(np.int64)
    summary: dict = {"path": str(path), "kind": "hcpe3", "bytes": readable_size(path, "hcpe3"),
                     "games": positions.games, "moves": int(move_nums.sum()), "positions": n,
                     "repetitions_left_out": positions.repetitions, "results": by_result, "result_flags": flags,
                     "opponents": opponents,
                     "plies": {"min": int(move_nums.min()) if len(move_nums) else 0,
                               "max": int(move_nums.max()) if len(move_nums) else 0}}
    if n:
        records = positions.hcpe_records(np.arange(n))
        result = results_for_side_to_move(records, "hcpe")
        summary["side_to_move"] = {"win": int((result == 1).sum()), "draw": int((result == 0.5).sum()),
                                   "loss": int((result == 0).sum())}
        evals = records["eval"].astype(np.int64)
        summary.update(evals_zero=int((evals == 0).sum()), eval_min=int(evals.min()), eval_max=int(evals.max()),
                       eval_histogram=np.histogram(evals, bins=EVAL_EDGES)[0].tolist())
        with_candidates = counts > 0
        candidate_of = np.repeat(np.arange(n), counts)  # the position of each candidate
        best = np.zeros(n, np.int64)
        np.maximum.at(best, candidate_of, visits)
        is_selected = np.asarray(positions.cand_move16) == np.asarray(positions.move16)[candidate_of]
        selected = np.full(n, -1, np.int64)
        np.maximum.at(selected, candidate_of[is_selected], visits[is_selected])
        top_is_selected = int(((selected == best) & with_candidates).sum())
        summary["candidates"] = {
            "positions_without": int((~with_candidates).sum()), "mean": float(counts.mean()), "max": int(counts.max()),
            "visits_mean": float(visits.mean()) if len(visits) else 0.0,
            "selected_is_most_visited": top_is_selected}
        hashes = packed_hashes(np.ascontiguousarray(np.asarray(positions.hcp)))
        summary["duplicate_positions"] = int(n - len(np.unique(hashes)))
        summary["games_with_positions"] = int(len(np.unique(game_ids)))
    return summary


def _hcpe3_headers(path: Path, offsets: np.ndarray) -> np.ndarray:
    from tideborn.data.cache.hcpe3 import HEADER_DTYPE, HEADER_SIZE

    out = np.zeros(len(offsets), HEADER_DTYPE)
    fd, _ = open_record_file(path, "hcpe3")
    try:
        for i, offset in enumerate(offsets.tolist()):
            data = os.pread(fd, HEADER_SIZE, offset)
            if len(data) < HEADER_SIZE:
                raise ChangedWhileRead(f"{path}: changed while it was read: it ends at byte {os.fstat(fd).st_size:,} "
                                       f"now, before game {i} (byte {offset:,}); was it truncated or rewritten?")
            out[i] = np.frombuffer(data, HEADER_DTYPE)[0]
    finally:
        os.close(fd)
    return out


def format_hcpe3(f: dict) -> str:
    n = f["positions"]
    lines = [f"{f['path']}: hcpe3, {f['games']:,} games, {f['moves']:,} moves, {n:,} positions "
             f"({f['repetitions_left_out']:,} repetitions left out; {f['bytes']:,} bytes)"]
    games = f["games"]
    lines.append("  game results:   " + ", ".join(f"{k} {v:,} ({_percent(v, games)})" for k, v in f["results"].items())
                 + "; " + ", ".join(f"{k} {v:,}" for k, v in f["result_flags"].items()))
    lines.append(f"  plies:          {f['plies']['min']}..{f['plies']['max']}")
    if n:
        lines.append("  side to move:   " + ", ".join(f"{k} {_percent(v, n)}" for k, v in f["side_to_move"].items()))
        lines.append(f"  eval:           {f['evals_zero']:,} zero ({_percent(f['evals_zero'], n)}), "
                     f"range {f['eval_min']}..{f['eval_max']}")
        c = f["candidates"]
        lines.append(f"  candidates:     {c['mean']:.1f} a position on average, at most {c['max']}; "
                     f"{c['positions_without']:,} positions without (trained one-hot on the selected move); "
                     f"{c['visits_mean']:.1f} visits a candidate on average")
        lines.append(f"  selected move:  the most visited in {c['selected_is_most_visited']:,} of "
                     f"{n - c['positions_without']:,} positions with candidates")
        lines.append(f"  duplicates:     {f['duplicate_positions']:,} positions seen before "
                     f"({_percent(f['duplicate_positions'], n)})")
    return "\n".join(lines)


def verify_hcpe3(path: Path) -> list[BadRecordReport]:
    """Replay every game of `path` (without the cache): the first malformed game, if any; then its positions
    cache, when there is one (`cache_problem`)."""
    from tideborn.data.cache.hcpe3 import _build

    try:
        built, content = _build(Path(path))
    except ChangedWhileRead:
        raise  # not a verdict on the file: one line, exit 2
    except UserError as exc:
        text = str(exc)
        prefix = f"{path}: "
        return [BadRecordReport(str(path), None, text[len(prefix):] if text.startswith(prefix) else text)]
    problem = cache_problem(Path(path), built["arrays"], content)
    return [] if problem is None else [problem]


def cache_problem(path: Path, arrays: dict[str, np.ndarray], content: str) -> BadRecordReport | None:
    """What is wrong with the positions cache beside hcpe3 file `path`, whose games decode to `arrays` and
    whose bytes hash to `content`: its arrays fail their checksums, or it was built from this very content
    yet holds other positions. A cache built from another version of the file is not a problem (the next
    run rebuilds it), nor one that training leaves alone (a link, someone else's: training warns)."""
    from tideborn.data.cache.cachefile import DamagedCache, HostileCache
    from tideborn.data.cache.hcpe3 import CACHE_FORMAT, cache_path, read_arrays, trusted_owners
    from tideborn.data.cache.hcpe3_compact import compact

    cache = cache_path(path)
    source = f"the positions cache of {path}"
    try:
        found = read_arrays(cache, CACHE_FORMAT, source, trusted_owners(path))
    except HostileCache:
        return None
    except DamagedCache as exc:
        return BadRecordReport(str(cache), None, f"{source} is damaged ({exc}); delete it: it is built again")
    if found is None or found[0].get("content") != content:
        return None
    for name, want in compact(arrays).items():  # the cache holds the compact layout of the arrays
        got = found[1].get(name)
        if got is None or got.shape != want.shape or not np.array_equal(np.asarray(got), want):
            return BadRecordReport(str(cache), None, f"{source} does not hold the file's positions (its array "
                                                     f"{name!r} differs from a fresh decode); delete it: it is "
                                                     f"built again")
    return None
