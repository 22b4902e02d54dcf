"""`python -m tideborn.data inspect|verify|convert|split` (also `tideborn data ...`).

Reports go to stdout, progress and warnings to stderr. Exit status: 0 done, 1 `verify` found bad records,
2 bad input (a missing or unreadable file, a bad argument) or an output that could not be written (a full
disk), with one line saying what was wrong; 130 interrupted (Ctrl-C), with one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tideborn.cliparser import OneLineParser
from tideborn.errors import UserError, run_command

VERIFY_FOUND_BAD = 1


def _add_files(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="hcpe, psv or hcpe3 files (or quoted globs)")
    parser.add_argument("--kind", default="auto", choices=("auto", "hcpe", "psv", "hcpe3"),
                        help="record format; auto: from the extension (.hcpe; .bin or .psv; .hcpe3)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description="Check and prepare teacher data (hcpe, psv, hcpe3) and game records.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{inspect,verify,convert,split}",
                                parser_class=OneLineParser)
    inspect = sub.add_parser("inspect", help="record count, results, eval histogram, plies, duplicates",
                             description="Record count, results, eval histogram, plies, duplicates.")
    _add_files(inspect)
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    verify = sub.add_parser("verify", help="decode every record; list bad ones; exit 1 if any",
                            description="Decode every record; list bad ones; exit 1 if any.")
    _add_files(verify)
    verify.add_argument("--max-listed", type=int, default=100, metavar="N",
                        help="list at most N bad records (all are counted; default 100)")
    convert = sub.add_parser("convert", help="CSA/KIF/KI2 game records into hcpe, with a game index",
                             description="CSA/KIF/KI2 game records into hcpe, with a game index.")
    convert.add_argument("inputs", nargs="+", type=Path, metavar="INPUT",
                         help="record files, or directories searched recursively")
    convert.add_argument("--output", "-o", type=Path, required=True, metavar="OUT.hcpe",
                         help="hcpe file to write (its game index goes beside it as OUT.games.csv)")
    convert.add_argument("--min-ply", type=int, default=1, metavar="N", help="skip games of fewer moves")
    convert.add_argument("--min-rating", type=float, metavar="R",
                         help="skip games with a stated rating under R (games without ratings are kept)")
    convert.add_argument("--include-handicap", action="store_true",
                         help="keep games that do not start from the standard position")
    convert.add_argument("--keep-duplicates", action="store_true", help="keep repeated identical games")
    convert.add_argument("--quiet", action="store_true", help="no progress or per-file warnings on stderr")
    split = sub.add_parser("split", help="split a converted hcpe file by game into train and test",
                           description="Split a converted hcpe file by game into train and test.")
    split.add_argument("source", type=Path, metavar="INPUT.hcpe", help="hcpe file with a game index (from convert)")
    split.add_argument("--train", type=Path, required=True, metavar="TRAIN.hcpe",
                       help="hcpe file to write the training games to (its game index goes beside it)")
    split.add_argument("--test", type=Path, required=True, metavar="TEST.hcpe",
                       help="hcpe file to write the held-out games to (none of their positions in train)")
    split.add_argument("--test-fraction", type=float, default=0.1, metavar="F",
                       help="fraction of games held out (default 0.1)")
    split.add_argument("--seed", type=int, default=0, help="seed of the game shuffle (default 0)")
    split.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser


def _files(args: argparse.Namespace) -> tuple[list[Path], str, list[Path]]:
    """(hcpe or psv files, their kind, hcpe3 files): hcpe3 files are games, read apart from the records."""
    from tideborn.data.formats.records import expand_paths, resolve_kind

    paths = expand_paths(args.files, ".", "FILE")
    for path in paths:
        if path.is_dir():
            raise UserError(f"{path}: is a directory; name the files in it (e.g. {path}/*.hcpe)")
        if not path.exists():
            raise UserError(f"{path}: no such file")
    if args.kind == "hcpe3":
        return [], "hcpe3", paths
    games = [p for p in paths if args.kind == "auto" and p.suffix.lower() == ".hcpe3"]
    records = [p for p in paths if p not in games]
    return records, resolve_kind(records, args.kind) if records else "hcpe3", games


def command_inspect(args: argparse.Namespace) -> int:
    from tideborn.data.tools.checks import format_hcpe3, format_inspection, inspect_files, summarise_hcpe3

    paths, kind, games = _files(args)
    report = inspect_files(paths, kind, progress=not args.quiet) if paths else {"kind": kind, "files": []}
    hcpe3 = [summarise_hcpe3(path, progress=not args.quiet) for path in games]
    if hcpe3:
        report["hcpe3"] = hcpe3
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join([format_inspection(report)] * bool(paths) + [format_hcpe3(f) for f in hcpe3]))
    return 0


def command_verify(args: argparse.Namespace) -> int:
    from tideborn.data.tools.checks import verify_files, verify_hcpe3

    paths, kind, games = _files(args)
    checked, problems = verify_files(paths, kind, progress=not args.quiet) if paths else (0, [])
    for path in games:
        problems.extend(verify_hcpe3(path))
    for problem in problems[:max(0, args.max_listed)]:
        print(problem)
    if len(problems) > args.max_listed:
        print(f"... and {len(problems) - args.max_listed:,} more")
    hcpe3 = f" and {len(games)} hcpe3 file(s) replayed" if games else ""
    print(f"verify: {checked:,} records in {len(paths)} file(s){hcpe3}: "
          + (f"{len(problems):,} bad" if problems else "all good"))
    return VERIFY_FOUND_BAD if problems else 0


def command_convert(args: argparse.Namespace) -> int:
    from tideborn.data.tools.convert import ConvertFilters, convert_games

    if args.min_ply < 0:
        raise UserError(f"--min-ply {args.min_ply}: must be >= 0")
    filters = ConvertFilters(args.min_ply, args.min_rating, args.include_handicap, not args.keep_duplicates)
    warn = None if args.quiet else (lambda text: print(f"warning: {text}", file=sys.stderr))
    report = convert_games(args.inputs, args.output, filters, progress=not args.quiet, warn=warn)
    print(report.summary(args.output, listed=not args.quiet))
    return 0


def command_split(args: argparse.Namespace) -> int:
    from tideborn.data.tools.split import split_games

    report = split_games(args.source, args.train, args.test, args.test_fraction, args.seed,
                         progress=not args.quiet)
    print(report.summary(args.train, args.test))
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m tideborn.data") -> int:
    args = build_parser(prog).parse_args(argv)
    handler = {"inspect": command_inspect, "verify": command_verify, "convert": command_convert,
               "split": command_split}[args.command]
    program = f"{prog} {args.command}"
    # Ctrl-C at any moment, numpy's and cshogi's imports included, is one line (errors.run_reporting_ctrl_c)
    return run_command(handler, args, program)
