"""A watched training set (`data.watch`): which files of the `data.train` globs have joined, in arrival order, and
the sliding window of the newest positions (`data.window_positions`) the data order draws from.

A scan sees each matching file. A file joins only when it is complete: it appeared by a rename (its inode
changed after its last write: ctime later than mtime, at first sight), or its size and mtime are the same at two
scans in a row (or it has not been written for a whole rescan interval), and then it parses whole (`count`: an
hcpe3 file decoded into its positions cache, an hcpe/psv file whole records). A file still changing is reported
as growing and not read. A joined file that vanishes or changes leaves the window with a warning and never
rejoins under that path (its positions may have been trained on: a changed file is not read again). A file that
does not parse is reported once and tried again only when it changes. A directory of the globs that vanishes
leaves the window as it is, with one warning: a deleted directory looks the same as an unmounted one.

A file's identity is its size, mtime, inode and ctime, and its content. Any write moves the ctime, even one that
puts the mtime back, so a rewrite in place is seen at the next scan and at resume; a file whose ctime alone moved
(a `chmod`, a `touch` that kept the times) is read again and stays if its content is the same. A joined file
moved to another matching name (a producer archiving into `done/`) is the same data: it keeps its place in the
arrival order under its new name, whether the move is seen at a scan or at resume. A new name holding the content
of a joined file (a copy) is not new data: it is said once and does not join.

Arrival order is the order files joined; files joining at one scan in sorted path order. The window is the last
`window_positions` positions of the joined files in that order (the oldest file in it may be cut: its newest
positions stay). No torch here; everything is plain data so that the checkpoint records it (`state_dict`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import time
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tideborn.errors import UserError
from tideborn.safefile import publish

RATE_SPAN_SECONDS = 3600.0
"""The arrival rate is the positions joined over this span (or since the watch began, when that is shorter)."""


@dataclass(frozen=True)
class Seen:
    """What a scan saw of a file: enough to tell it changed."""

    size: int
    mtime_ns: int
    inode: int
    ctime_ns: int = 0
    """Any write moves it, also one that puts the mtime back. 0: recorded by a version that did not keep it
    (the file is then read again to compare its content)."""

    @classmethod
    def of(cls, facts: os.stat_result) -> Seen:
        return cls(facts.st_size, facts.st_mtime_ns, facts.st_ino, facts.st_ctime_ns)

    def same_bytes_as(self, other: Seen) -> bool:
        """The same file, the same size and mtime: only the ctime may differ (its content then needs a look)."""
        return (self.size, self.mtime_ns, self.inode) == (other.size, other.mtime_ns, other.inode)


@dataclass(frozen=True)
class JoinedFile:
    path: str
    seen: Seen
    positions: int
    content: str
    """The hash of the whole file when it joined: its content identity in the checkpoint."""
    joined_at: float
    """Unix time of the scan it joined at."""

    def to_dict(self) -> dict:
        return {**asdict(self), "seen": asdict(self.seen)}

    @classmethod
    def from_dict(cls, raw: dict) -> JoinedFile:
        return cls(str(raw["path"]), Seen(**raw["seen"]), int(raw["positions"]), str(raw["content"]),
                   float(raw["joined_at"]))


@dataclass
class ScanResult:
    joined: list[JoinedFile] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)
    """(path, why) of files that left the window."""
    growing: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(path, why) of complete-looking files that do not parse, said once per version of the file."""
    vanished_dirs: list[str] = field(default_factory=list)
    """Directories of the globs that are gone now (said once, when they go)."""
    moved: list[tuple[str, str]] = field(default_factory=list)
    """(old path, new path) of joined files that moved to another matching name: they keep their place."""
    copies: list[tuple[str, str]] = field(default_factory=list)
    """(path, joined path) of new files with the content of a joined file: not new data, said once."""

    @property
    def changed(self) -> bool:
        return bool(self.joined or self.left or self.moved)

    def warnings(self) -> list[str]:
        texts = [f"data.watch: {path} left the window: {why}; it is not read again under that name"
                 for path, why in self.left]
        texts += [f"data.watch: {path} not joined: {why}" for path, why in self.refused]
        texts += [f"data.watch: {folder} is gone; the window stays as it is until it is back" for folder in
                  self.vanished_dirs]
        texts += [f"data.watch: {path} holds the same positions as {joined}, which joined already: not new data, "
                  f"not joined" for path, joined in self.copies]
        return texts

    def notes(self) -> list[str]:
        """What changed that is no problem: joined files that moved and keep their place."""
        return [f"data.watch: {old} moved to {new}; it keeps its place in the window" for old, new in self.moved]


Counter = typing.Callable[[Path], tuple[int, str]]
"""A file's (positions, content hash), parsing it whole; raises `UserError` for a file that does not parse."""

Derived = typing.Callable[[Path], list[Path]]
"""The project's own hidden files derived from a data file (an hcpe3 file's positions cache): removed when the
file leaves the window or does not join, moved along when it moves."""


def _no_derived(path: Path) -> list[Path]:
    return []


class DataWatch:
    """The joined files of `patterns` (absolute globs or paths) and the window over them."""

    def __init__(self, patterns: typing.Sequence[str], count: Counter, window_positions: int = 0,
                 rescan_seconds: float = 60.0, clock: typing.Callable[[], float] = time.time,
                 derived: Derived = _no_derived):
        self.patterns = list(patterns)
        self.count = count
        self.derived = derived
        self.window_positions = window_positions
        self.rescan_seconds = rescan_seconds
        self.clock = clock
        self.joined: list[JoinedFile] = []
        self.pending: dict[str, Seen] = {}
        """Files seen at the last scan, not joined yet: what they looked like then."""
        self.refused: dict[str, Seen] = {}
        """Files that did not parse, as they were then (tried again when they change)."""
        self.barred: set[str] = set()
        """Paths that left the window: never read again under that name."""
        self.gone_dirs: set[str] = set()
        self.generation = 0
        """Counts window changes: each gives the data order a new key."""
        self.resume_moved: list[tuple[str, str]] = []
        """(old path, new path) of window files found under another name at resume: they kept their place."""

    # -- scanning -------------------------------------------------------------------------------------------
    def _matches(self) -> tuple[list[str], list[str]]:
        """(files matching the globs in sorted order, the globs' directories that do not exist)."""
        found: list[str] = []
        missing: list[str] = []
        for pattern in self.patterns:
            folder = _fixed_folder(pattern)
            if not os.path.isdir(folder):
                missing.append(folder)
                continue
            if glob.has_magic(pattern):
                found += sorted(m for m in glob.glob(pattern, recursive=True) if os.path.isfile(m))
            elif os.path.isfile(pattern):
                found.append(pattern)
        return list(dict.fromkeys(found)), missing

    def scan(self) -> ScanResult:
        """One rescan: files join, leave, move, or are reported growing (see the module docstring)."""
        now = self.clock()
        result = ScanResult()
        paths, missing = self._matches()
        result.vanished_dirs = sorted(set(missing) - self.gone_dirs)
        self.gone_dirs = set(missing)
        gone = self._check_joined(set(paths), missing, result)
        in_window = {j.path for j in self.joined}
        by_content = {j.content: j.path for j in self.joined if j not in gone}
        pending: dict[str, Seen] = {}
        if gone:  # a gone file under a new name (its inode, size and mtime) is where it moved: before any copy
            renamed = {(j.seen.inode, j.seen.size, j.seen.mtime_ns) for j in gone}
            paths = sorted(paths, key=lambda path: _same_file_key(path) not in renamed)
        for path in paths:
            if path in in_window or path in self.barred:
                continue
            try:
                facts = os.stat(path)
            except OSError:
                continue  # gone between the listing and now: the next scan sees what is there
            seen = Seen.of(facts)
            if self.refused.get(path) == seen:
                continue
            before = self.pending.get(path)
            renamed_in = before is None and facts.st_ctime_ns > facts.st_mtime_ns
            quiet = now - facts.st_mtime_ns / 1e9 >= self.rescan_seconds
            if not (renamed_in or quiet or before == seen):
                pending[path] = seen
                result.growing.append(path)
                continue
            counted = self._count_new(path, seen, gone, pending, result)
            if counted is not None:
                self._place(path, seen, *counted, gone, by_content, result, now)
        for joined in gone:
            self.joined.remove(joined)
            result.left.append((joined.path, "the file is gone"))
            self.barred.add(joined.path)
            self._remove_derived(joined.path)
        self.pending = pending
        if result.changed:
            self.generation += 1
        return result

    def _check_joined(self, present: set[str], missing: list[str], result: ScanResult) -> list[JoinedFile]:
        """Joined files as they are now: changed ones leave (into `result`), a chmod is remembered; returned, those
        no longer at their path, kept in their place until the scan has seen whether they moved."""
        kept: list[JoinedFile] = []
        gone: list[JoinedFile] = []
        for joined in self.joined:
            if joined.path not in present:
                if not _fixed_folder_of(joined.path, missing):  # (a vanished directory keeps its files, said once)
                    gone.append(joined)
                kept.append(joined)
                continue
            try:
                seen = Seen.of(os.stat(joined.path))
            except OSError as exc:
                result.left.append((joined.path, f"cannot be read ({exc.strerror or exc})"))
                self.barred.add(joined.path)
                continue
            if seen != joined.seen:
                why = self._rewritten(joined, seen)
                if why is not None:
                    result.left.append((joined.path, why))
                    self.barred.add(joined.path)
                    self._remove_derived(joined.path)
                    continue
                joined = dataclasses.replace(joined, seen=seen)
            kept.append(joined)
        self.joined = kept
        return gone

    def _count_new(self, path: str, seen: Seen, gone: list[JoinedFile], pending: dict[str, Seen],
                   result: ScanResult) -> tuple[int, str] | None:
        """(positions, content) of a complete-looking new file, or None: it does not parse or holds nothing
        (refused, said once), or it was written to while read (growing after all)."""
        for joined in gone:  # moved, it seems (a rename keeps both): its cache goes along, not built again
            if (joined.seen.size, joined.seen.mtime_ns) == (seen.size, seen.mtime_ns):
                self._move_derived(joined.path, path)
                break
        try:
            positions, content = self.count(Path(path))
        except UserError as exc:
            self.refused[path] = seen
            result.refused.append((path, str(exc).removeprefix(f"{path}: ")))
            self._remove_derived(path)
            return None
        try:
            after = Seen.of(os.stat(path))
        except OSError:
            return None
        if after != seen:  # written to while it was parsed: not complete after all
            pending[path] = after
            result.growing.append(path)
            return None
        if positions == 0:
            self.refused[path] = seen
            result.refused.append((path, "holds no training position"))
            return None
        self.refused.pop(path, None)
        return positions, content

    def _place(self, path: str, seen: Seen, positions: int, content: str, gone: list[JoinedFile],
               by_content: dict[str, str], result: ScanResult, now: float) -> None:
        """A counted new file: a joined file that moved here (its place kept), a copy of one (not joined), or new
        data (joined, the newest)."""
        moved = next((j for j in gone if j.content == content), None)
        if moved is not None:
            gone.remove(moved)  # the same data under a new name: it keeps its place and its arrival time
            self.joined[self.joined.index(moved)] = dataclasses.replace(moved, path=path, seen=seen)
            by_content[content] = path
            result.moved.append((moved.path, path))
        elif content in by_content:
            self.refused[path] = seen
            result.copies.append((path, by_content[content]))
            self._remove_derived(path)
        else:
            joined = JoinedFile(path, seen, positions, content, now)
            by_content[content] = path
            self.joined.append(joined)
            result.joined.append(joined)

    # -- the window -----------------------------------------------------------------------------------------
    @property
    def total_positions(self) -> int:
        return sum(j.positions for j in self.joined)

    def window(self) -> tuple[list[JoinedFile], int]:
        """(the files the window reaches into, oldest first; how many positions of the first are left out)."""
        total = self.total_positions
        if not self.window_positions or total <= self.window_positions:
            return list(self.joined), 0
        files: list[JoinedFile] = []
        held = 0
        for joined in reversed(self.joined):
            files.append(joined)
            held += joined.positions
            if held >= self.window_positions:
                break
        return files[::-1], held - self.window_positions

    @property
    def window_size(self) -> int:
        files, cut = self.window()
        return sum(j.positions for j in files) - cut

    def arrival_positions_per_hour(self) -> float:
        """Positions joined per hour over the last `RATE_SPAN_SECONDS` (since the first join, when sooner)."""
        if not self.joined:
            return 0.0
        now = self.clock()
        since = max(now - RATE_SPAN_SECONDS, min(j.joined_at for j in self.joined))
        recent = sum(j.positions for j in self.joined if j.joined_at >= since)
        return recent * 3600.0 / max(now - since, self.rescan_seconds)

    def newest_age_seconds(self) -> float | None:
        """Seconds since the newest joined file was last written."""
        if not self.joined:
            return None
        return max(0.0, self.clock() - max(j.seen.mtime_ns for j in self.joined) / 1e9)

    # -- checkpoints ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"joined": [j.to_dict() for j in self.joined],
                "pending": {p: asdict(s) for p, s in self.pending.items()},
                "refused": {p: asdict(s) for p, s in self.refused.items()},
                "barred": sorted(self.barred), "generation": self.generation,
                "window_positions": self.window_positions}

    def load_state_dict(self, state: dict) -> list[tuple[str, str]]:
        """The watch as the checkpoint recorded it. Each window file is checked against its content identity:
        one that is gone or changed leaves (returned as (path, why), for warnings), and the window changes."""
        self.joined = [JoinedFile.from_dict(raw) for raw in state["joined"]]
        self.pending = {p: Seen(**s) for p, s in state.get("pending", {}).items()}
        self.refused = {p: Seen(**s) for p, s in state.get("refused", {}).items()}
        self.barred = set(state.get("barred", []))
        self.generation = int(state["generation"])
        left: list[tuple[str, str]] = []
        kept: list[JoinedFile] = []
        self.resume_moved = []
        unknown: list[str] | None = None
        for joined in self.joined:
            if not os.path.exists(joined.path):
                if unknown is None:
                    known = {j.path for j in self.joined} | set(self.pending) | set(self.refused) | self.barred
                    unknown = [path for path in self._matches()[0] if path not in known]
                moved = self._moved_to(joined, unknown)
                if moved is not None:
                    unknown.remove(moved.path)
                    self.resume_moved.append((joined.path, moved.path))
                    kept.append(moved)
                    continue
            why = self._changed_since(joined)
            if why is None:
                with contextlib.suppress(OSError):  # the same content: what it looks like now is what counts
                    joined = dataclasses.replace(joined, seen=Seen.of(os.stat(joined.path)))
                kept.append(joined)
            else:
                left.append((joined.path, why))
                self.barred.add(joined.path)
        self.joined = kept
        if left:
            self.generation += 1
        return left

    def _moved_to(self, joined: JoinedFile, candidates: list[str]) -> JoinedFile | None:
        """`joined`, gone from its path, under one of `candidates` (paths the watch has not seen): the file whose
        size and mtime are its own (a rename or `mv` keeps both) and whose content is its own; its own inode
        first (a rename keeps it, where `cp -p` would make a copy with the same size and mtime)."""
        own = (joined.seen.inode, joined.seen.size, joined.seen.mtime_ns)
        for path in sorted(candidates, key=lambda path: _same_file_key(path) != own):
            try:
                seen = Seen.of(os.stat(path))
            except OSError:
                continue
            if (seen.size, seen.mtime_ns) != (joined.seen.size, joined.seen.mtime_ns):
                continue
            self._move_derived(joined.path, path)
            try:
                positions, content = self.count(Path(path))
            except UserError:
                continue
            if (content, positions) == (joined.content, joined.positions):
                return dataclasses.replace(joined, path=path, seen=seen)
        return None

    def _remove_derived(self, path: str) -> None:
        """Remove what the project derived from `path` (its data is no longer in any window)."""
        for derived in self.derived(Path(path)):
            with contextlib.suppress(OSError):  # already gone, or not ours to remove: nothing to say
                derived.unlink()

    def _move_derived(self, old: str, new: str) -> None:
        """Move what the project derived from `old` to where `new`'s would be, where nothing is there yet (a
        derived file checks its source when opened: a wrong match is rebuilt, never trusted)."""
        for before, after in zip(self.derived(Path(old)), self.derived(Path(new))):
            if before.exists() and not after.exists():
                with contextlib.suppress(OSError):  # another filesystem, say: then it is built again
                    publish([(before, after)])

    def _changed_since(self, joined: JoinedFile) -> str | None:
        try:
            seen = Seen.of(os.stat(joined.path))
        except OSError:
            return "the file is gone since the checkpoint"
        if seen == joined.seen:
            return None
        try:
            positions, content = self.count(Path(joined.path))
        except UserError as exc:
            return f"it changed since the checkpoint and no longer parses ({exc})"
        if content != joined.content:
            return "its content changed since the checkpoint"
        return None if positions == joined.positions else "its positions changed since the checkpoint"

    def _rewritten(self, joined: JoinedFile, seen: Seen) -> str | None:
        """Why a joined file that looks different now (`seen`) leaves the window; None when only its ctime moved
        and its content is what joined (a `chmod`, say: it stays)."""
        if not seen.same_bytes_as(joined.seen):
            return f"it changed after joining (size {joined.seen.size:,} -> {seen.size:,} bytes)"
        try:
            positions, content = self.count(Path(joined.path))
        except UserError as exc:
            return f"it was rewritten in place and no longer parses ({exc})"
        if (content, positions) != (joined.content, joined.positions):
            return "it was rewritten in place (the same size and mtime, other content)"
        return None

    def unseen_files(self) -> list[str]:
        """Matching files that are neither in the window nor known to the watch (arrived since the state was
        recorded): they join at the next rescan."""
        known = {j.path for j in self.joined} | set(self.pending) | set(self.refused) | self.barred
        return [p for p in self._matches()[0] if p not in known]


def window_seed(seed: int, generation: int) -> int:
    """The data order's key for the window's `generation`th change: a new order over the new window, the same in
    every run that saw the same changes."""
    import numpy as np  # the watch itself needs no numpy; the loader that calls this has it loaded

    return int(np.random.SeedSequence([seed, generation, 0x57A7C4]).generate_state(1)[0])


def _fixed_folder(pattern: str) -> str:
    """The directory part of `pattern` before any glob character (what must exist for it to match)."""
    parts = Path(pattern).parts
    fixed: list[str] = []
    for part in parts[:-1]:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return str(Path(*fixed)) if fixed else "."


def _same_file_key(path: str) -> tuple[int, int, int] | None:
    """(inode, size, mtime): what a rename keeps (a new file may reuse a deleted file's inode, not all three)."""
    try:
        facts = os.stat(path)
    except OSError:
        return None
    return facts.st_ino, facts.st_size, facts.st_mtime_ns


def _fixed_folder_of(path: str, folders: list[str]) -> bool:
    return any(Path(path).is_relative_to(folder) for folder in folders)
