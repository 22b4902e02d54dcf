"""Three readings of one hcpe3 file compared: tideborn's reader, dlshogi's C++ loader, a plain cshogi replay.

The plain replay (`bench_hcpe3_file.reference_moves`) reads the layout on its own and works out dlshogi's
rules, so a disagreement says which side departs from the format or from dlshogi. Positions are matched by
(game, move); every difference is counted by kind and the first few are named by game and move.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import cshogi
import numpy as np
from cshogi.dlshogi import make_input_features, make_move_label

from benchmarks.hcpe3_file import ReferenceMove
from tideborn.data.cache.hcpe3 import Hcpe3File
from tideborn.data.sets.sources import BatchDecoder, Hcpe3Part, TeacherSource

POLICY = 27 * 81
DLSHOGI_EVAL_SCALE = 1 / 0.0013226
"""dlshogi's `score_to_value`: sigmoid(eval * 0.0013226), i.e. eval / 756.08."""


class Findings:
    """Differences by kind, with the first few places of each."""

    def __init__(self, examples: int = 5):
        self.counts: dict[str, int] = defaultdict(int)
        self.places: dict[str, list[str]] = defaultdict(list)
        self.examples = examples

    def add(self, kind: str, where: str) -> None:
        self.counts[kind] += 1
        if len(self.places[kind]) < self.examples:
            self.places[kind].append(where)

    def expect(self, equal: bool, kind: str, where: str) -> None:
        if not equal:
            self.add(kind, where)

    def lines(self) -> list[str]:
        return [f"  {kind}: {count:,} (first: {'; '.join(self.places[kind])}{', ...' if count > self.examples else ''})"
                for kind, count in self.counts.items()]


def _dense(policy: dict[int, float], turn: int) -> np.ndarray:
    out = np.zeros(POLICY, np.float64)
    for move16, probability in policy.items():
        out[make_move_label(move16, turn)] = probability
    return out


def _dense_sparse(labels: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    out = np.zeros(POLICY, np.float64)
    np.add.at(out, labels, probabilities)
    return out


def _named(ref: ReferenceMove) -> str:
    return f"game {ref.game} move {ref.ply}"


def check_tideborn(path: Path, moves: list[ReferenceMove], findings: Findings) -> str:
    """tideborn's positions (decoded without touching a cache) against the plain replay: which moves are
    positions (all but dlshogi's repetitions), and for each its position, move, eval, result byte,
    candidates and training distribution (temperature 1; one-hot on the selected move without candidates)."""
    positions = Hcpe3File(path, cache=False).positions()
    by_move = {(m.game, m.ply): m for m in moves}
    ours = {(g, p): i for i, (g, p) in enumerate(zip(positions.game.tolist(), positions.ply.tolist()))}
    expected = {(m.game, m.ply) for m in moves if m.repetition is None}
    for key in sorted(set(ours) - expected):
        findings.add("tideborn keeps a position dlshogi's rules leave out",
                     f"game {key[0]} move {key[1]} ({by_move[key].repetition if key in by_move else 'no such move'})")
    for key in sorted(expected - set(ours)):
        findings.add("tideborn leaves out a position", f"game {key[0]} move {key[1]}")
    board = cshogi.Board()
    common = sorted(set(ours) & expected)
    indices = np.array([ours[key] for key in common], dtype=np.int64)
    labels, probabilities, _ = positions.targets(indices, 1.0)
    for k, key in enumerate(common):
        i, ref = ours[key], by_move[key]
        where = _named(ref)
        findings.expect(positions.hcp[i].tobytes() == ref.hcp, "tideborn: position (hcp) differs", where)
        findings.expect(int(positions.move16[i]) == ref.move16, "tideborn: selected move differs", where)
        findings.expect(int(positions.eval[i]) == ref.eval, "tideborn: eval differs", where)
        findings.expect(int(positions.result[i]) == ref.result_byte, "tideborn: result byte differs", where)
        findings.expect(np.array_equal(positions.candidates(i), ref.candidates), "tideborn: candidates differ", where)
        board.set_hcp(np.frombuffer(ref.hcp, np.uint8))
        want = _dense(ref.policy or {ref.move16: 1.0}, board.turn)
        findings.expect(np.allclose(_dense_sparse(labels[k], probabilities[k]), want, atol=1e-6),
                        "tideborn: distribution differs", where)
    return (f"tideborn: {len(positions):,} positions ({positions.repetitions:,} repetitions left out); plain replay "
            f"by dlshogi's rules but keeping moves without candidates: {len(expected):,}")


def check_dlshogi(data, path: Path, moves: list[ReferenceMove], findings: Findings, batch_size: int = 512) -> str:
    """dlshogi's loaded file (`DlshogiData`) against the plain replay (its rules) and tideborn's positions:
    per dlshogi entry the position, input planes (cshogi's), distribution, result and value; tideborn's
    decoded as the trainer's workers decode them (`sources.BatchDecoder` on a one-file source)."""
    kept = [m for m in moves if m.dlshogi_keeps]
    if data.positions != len(kept):
        findings.add("dlshogi's count differs from the plain replay by its rules",
                     f"dlshogi {data.positions:,}, replay {len(kept):,}")
    positions = Hcpe3File(path, cache=False).positions()
    source = TeacherSource([Hcpe3Part([positions])], "hcpe3")
    ours = {(g, p): i for i, (g, p) in enumerate(zip(positions.game.tolist(), positions.ply.tolist()))}
    board = cshogi.Board()
    planes1 = np.zeros((62, 9, 9), np.float32)
    planes2 = np.zeros((57, 9, 9), np.float32)
    # value_lambda 1: the value target is sigmoid(eval / scale) alone, what dlshogi's `value` holds
    decoder = BatchDecoder(DLSHOGI_EVAL_SCALE, value_lambda=1.0, bad_records="error", temperature=1.0)
    count = min(data.positions, len(kept))
    for start in range(0, count, batch_size):
        stop = min(start + batch_size, count)
        data.decode(np.arange(start, stop, dtype=np.uint64))
        refs = kept[start:stop]
        present = [k for k, ref in enumerate(refs) if (ref.game, ref.ply) in ours]
        mine = np.array([ours[(refs[k].game, refs[k].ply)] for k in present], dtype=np.int64)
        decoded = decoder.decode(source, mine)
        labels, probabilities = decoded.policy_labels, decoded.policy_probs
        row_of = {k: r for r, k in enumerate(present)}
        for k, ref in enumerate(refs):
            where = f"dlshogi entry {start + k}, {_named(ref)}"
            findings.expect(data.hcp(start + k) == ref.hcp, "dlshogi: position differs from the replay's", where)
            board.set_hcp(np.frombuffer(ref.hcp, np.uint8))
            planes1.fill(0)
            planes2.fill(0)
            make_input_features(board, planes1, planes2)
            findings.expect(np.array_equal(data.features1[k], planes1) and np.array_equal(data.features2[k], planes2),
                            "dlshogi: input planes differ from cshogi's", where)
            findings.expect(np.allclose(data.probability[k], _dense(ref.policy, board.turn), atol=1e-6),
                            "dlshogi: distribution differs from visits over their sum", where)
            findings.expect(float(data.result[k]) == ref.result, "dlshogi: result differs from the stored one", where)
            if k not in row_of:
                continue  # tideborn lacks the position: counted by check_tideborn
            r = row_of[k]
            findings.expect(np.array_equal(decoded.features1[r], planes1.astype(np.uint8))
                            and np.array_equal(decoded.features2[r], planes2[:, 0, 0].astype(np.uint8)),
                            "tideborn vs dlshogi: input planes differ", where)
            findings.expect(np.allclose(_dense_sparse(labels[r], probabilities[r]), data.probability[k], atol=1e-6),
                            "tideborn vs dlshogi: distribution differs", where)
            findings.expect(float(decoded.result[r]) == float(data.result[k]), "tideborn vs dlshogi: result differs",
                            where)
            findings.expect(abs(float(decoded.value[r]) - float(data.value[k])) < 1e-5,
                            "tideborn vs dlshogi: value sigmoid(eval/756.08) differs", where)
    without = int((np.diff(positions.cand_offsets) == 0).sum())
    return (f"dlshogi: {data.positions:,} positions; tideborn has {len(positions) - without:,} with candidates "
            f"(+{without:,} without, which dlshogi skips)")


def cross_check(path: Path, moves: list[ReferenceMove], dlshogi_data=None) -> tuple[list[str], bool]:
    """Report lines and whether the readings agree (tideborn's extra positions without candidates, a
    documented difference, do not count against it)."""
    findings = Findings()
    lines = [check_tideborn(path, moves, findings)]
    if dlshogi_data is not None:
        lines.append(check_dlshogi(dlshogi_data, path, moves, findings))
    if findings.counts:
        lines.append("DIFFERENCES")
        lines.extend(findings.lines())
    else:
        lines.append("all readings agree")
    return lines, not findings.counts



def check_average(path: Path, moves: list[ReferenceMove], dlshogi: dict) -> tuple[list[str], bool]:
    """Duplicate averaging (`data.use_average`, built without a cache and decoded as the trainer does)
    against dlshogi's `use_average` (`dlshogi`: the arrays `bench_hcpe3 dlshogi --dump-average` saves).
    Positions are matched by hcp. Their targets are compared where both merged the same moves; where the
    moves differ (tideborn also trains moves without candidates; the repetition rule) they are counted."""
    from tideborn.config.load import load_settings
    from tideborn.data.sets.average import AveragedPart, build_average

    findings = Findings()
    settings = load_settings(None, [f"data.train={[str(path)]!r}".replace("'", '"'), "data.use_average=true",
                                    f"data.eval_scale={DLSHOGI_EVAL_SCALE!r}"], environ={}).settings
    positions = Hcpe3File(path, cache=False).positions()
    meta, arrays = build_average(TeacherSource([Hcpe3Part([positions])], "hcpe3"), settings.data)
    part = AveragedPart(path, [path], dict(meta), arrays)
    ours = {row.tobytes(): i for i, row in enumerate(np.asarray(arrays["hcp"]))}
    by_move = {(m.game, m.ply): m for m in moves}
    ours_moves: dict[bytes, set] = defaultdict(set)
    for key in zip(positions.game.tolist(), positions.ply.tolist()):
        ours_moves[by_move[key].hcp].add(key)
    theirs_moves: dict[bytes, set] = defaultdict(set)
    for m in moves:
        if m.dlshogi_keeps:
            theirs_moves[m.hcp].add((m.game, m.ply))
    theirs = {row.tobytes(): i for i, row in enumerate(dlshogi["hcp"])}
    same = sorted((hcp for hcp in theirs if ours_moves.get(hcp) == theirs_moves.get(hcp)), key=theirs.get)
    apart = [hcp for hcp in set(theirs) | set(ours) if ours_moves.get(hcp) != theirs_moves.get(hcp)]
    if len(theirs_moves) != len(theirs):
        findings.add("dlshogi's merged count differs from the plain replay's distinct positions",
                     f"dlshogi {len(theirs):,}, replay {len(theirs_moves):,}")
    dense_theirs = defaultdict(dict)
    for entry, label, probability in zip(dlshogi["entry"].tolist(), dlshogi["label"].tolist(),
                                         dlshogi["probability"].tolist()):
        dense_theirs[entry][label] = probability
    decoder = BatchDecoder(DLSHOGI_EVAL_SCALE, value_lambda=1.0, bad_records="error", temperature=1.0)
    source = TeacherSource([part], "average")
    for start in range(0, len(same), 1024):
        chunk = same[start:start + 1024]
        decoded = decoder.decode(source, np.array([ours[h] for h in chunk], dtype=np.int64))
        for r, hcp in enumerate(chunk):
            j = theirs[hcp]
            first = min(theirs_moves[hcp])
            where = f"dlshogi entry {j} (first seen game {first[0]} move {first[1]}, {len(theirs_moves[hcp])} moves)"
            want = np.zeros(POLICY, np.float64)
            for label, probability in dense_theirs[j].items():
                want[label] = probability
            findings.expect(np.allclose(_dense_sparse(decoded.policy_labels[r], decoded.policy_probs[r]), want,
                                        atol=1e-5), "averaged distribution differs", where)
            findings.expect(abs(float(decoded.result[r]) - float(dlshogi["result"][j])) < 1e-6,
                            "averaged result differs", where)
            findings.expect(abs(float(decoded.value[r]) - float(dlshogi["value"][j])) < 1e-5,
                            "averaged value differs", where)
    only_no_candidates = sum(1 for hcp in apart if all(
        len(by_move[k].candidates) == 0 for k in ours_moves.get(hcp, set()) - theirs_moves.get(hcp, set()))
        and theirs_moves.get(hcp, set()) <= ours_moves.get(hcp, set()))
    lines = [f"averaging: dlshogi {len(theirs):,} entries from {int(dlshogi['read']):,} positions; tideborn "
             f"{meta['positions']:,} from {meta['inputs']:,}; {len(same):,} merged from the same moves in both, "
             f"compared; {len(apart):,} merged from other moves ({only_no_candidates:,} only by tideborn's moves "
             f"without candidates, {len(apart) - only_no_candidates:,} otherwise: the repetition rule)"]
    lines += ["DIFFERENCES", *findings.lines()] if findings.counts else ["averaged targets agree"]
    return lines, not findings.counts
