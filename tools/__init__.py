"""The verbs around the harness; nothing imports them.

  pod/      `./run.sh scale` (runs on TPU slices predicted from their compiled steps) and
            `./run.sh dryrun` (an MLPerf dry run before booking hardware)
  sweep/    `./run.sh sweep` and `./run.sh ablate`
  perf/     `./run.sh perf` and `./run.sh throughput`
  prepare/  `./run.sh prepare`: datasets from their official downloads
  package   `./run.sh package`: an MLPerf submission package, checked and scored
  check     `./run.sh check`: MLPerf compliance of a run's logs
"""
