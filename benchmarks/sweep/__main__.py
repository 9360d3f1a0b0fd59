"""`python -m benchmarks.sweep` (`./run.sh sweep`): `benchmarks.sweep.cli`."""

from benchmarks import main as cli
from benchmarks.sweep.cli import main

cli.run_main(main)
