import sys

from tideborn.trainer.cli import main

sys.exit(main())
