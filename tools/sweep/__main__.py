"""`python -m tools.sweep` (`./run.sh sweep`): `tools.sweep.cli`."""

from harness import cli
from tools.sweep.cli import main

cli.run_main(main)
