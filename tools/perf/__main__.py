"""`python -m tools.perf` (`./run.sh perf`): `tools.perf.cli`."""

import sys

from tools.perf.cli import main

sys.exit(main(sys.argv[1:]))
