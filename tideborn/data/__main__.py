import sys

from tideborn.data.cli import main

sys.exit(main())
