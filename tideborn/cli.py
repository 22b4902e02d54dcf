"""The `tideborn` console script: one entry point for the trainer's commands and the tools."""

from __future__ import annotations

import sys

USAGE = """usage: tideborn COMMAND ...

commands:
  train     train (resumes from the newest checkpoint)     tideborn train --config configs/smoke.toml
  summary   show the network and the settings train uses   tideborn summary --config configs/smoke.toml
  config    print the resolved settings as JSON            tideborn config --config configs/smoke.toml
  run       start|status|stop|watch a detached run         tideborn run status --out-dir runs/ckpt/smoke
  data      inspect|verify|convert|split teacher data      tideborn data inspect data/teacher/train.hcpe
  export    a checkpoint's network as checked ONNX         tideborn export --checkpoint CKPT --out model.onnx
  match     two checkpoints play each other: score and Elo tideborn match A.pt B.pt --games 200

Each command takes --help."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)  # asked-for help is output; a bare call, a mistake
        return 0 if argv else 2
    command = argv[0]
    if command in ("train", "summary", "config"):
        from tideborn.trainer.cli import main as trainer_main

        return trainer_main(argv, prog="tideborn")
    if command == "run":
        from tideborn.tools.train_run import main as train_run_main

        return train_run_main(argv[1:], prog="tideborn run")
    if command == "data":
        from tideborn.data.cli import main as data_main

        return data_main(argv[1:], prog="tideborn data")
    if command == "export":
        from tideborn.export.cli import main as export_main

        return export_main(argv[1:], prog="tideborn export")
    if command == "match":
        from tideborn.match.cli import main as match_main

        return match_main(argv[1:], prog="tideborn match")
    print(f"tideborn: error: unknown command {command!r} (see tideborn --help)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
