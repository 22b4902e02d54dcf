"""`python -m tideborn.data`: the data tools, Ctrl-C reported as one line, during their imports too."""

import sys

from tideborn.errors import run_reporting_ctrl_c


def command() -> int:
    from tideborn.data.tools.cli import main

    return main()


sys.exit(run_reporting_ctrl_c(command, "python -m tideborn.data"))
