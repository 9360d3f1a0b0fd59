"""`python -m benchmarks.perf` (`./run.sh perf`): `benchmarks.perf.cli`."""

import sys

from benchmarks.perf.cli import main

sys.exit(main(sys.argv[1:]))
