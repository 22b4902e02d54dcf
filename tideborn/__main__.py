"""`python -m tideborn`: the `tideborn` command."""

import sys

from tideborn.cli import main

sys.exit(main(prog="tideborn"))
