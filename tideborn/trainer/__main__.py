import os
import sys

from tideborn.trainer.cli import main

code = main()
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    # A torchrun rank, done: its process group is destroyed and its files are closed. It leaves without the
    # interpreter's teardown, in which a C++ thread of the distributed backend still joinable could end the
    # rank with "terminate called without an active exception" (SIGABRT) after the run had finished and
    # saved, making torchrun report a failure.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)
sys.exit(code)
