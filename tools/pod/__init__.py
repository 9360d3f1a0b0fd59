"""Pod work, on a machine without the pod (the compile-only runs themselves:
`harness.compile_only`).

  points         runs to predict, as data (`points/`: Google's MLPerf v0.6 TPU-v3 submissions)
  google_v06     Google's v0.6 submissions derived from their logs (writes `points/`)
  scale          predicted steps and minutes beside measured ones (`./run.sh scale`)
  compile_point  one point compiled in a process of its own, for its own libtpu flags
  dryrun         an MLPerf dry run: compiled, logged, checked, RCPs; one verdict
"""
