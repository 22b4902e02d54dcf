"""`python -m tideborn.trainer`: the trainer's commands, Ctrl-C reported as one line, during their imports too."""

import os
import sys

from tideborn.errors import run_reporting_ctrl_c


def command() -> int:
    from tideborn.trainer.cli import main

    return main()


code = run_reporting_ctrl_c(command, "python -m tideborn.trainer")
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    # A torchrun rank, done: its process group is destroyed and its files are closed. It leaves without the
    # interpreter's teardown, in which a C++ thread of the distributed backend still joinable could end the
    # rank with "terminate called without an active exception" (SIGABRT) after the run had finished and
    # saved, making torchrun report a failure.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)
sys.exit(code)
