"""The harness: the one way a run is set up, built, trained or compiled.

  main           `./run.sh <benchmark>`: train the run, a series of runs, or compile it only
  cli            the command line to one typed `Run` (`setup`); a verb's endings (`run_main`)
  run, options   the typed run (entry, config, mesh, layout, plan, devices) and its options,
                 which are also the table of its flags (`flags` builds them)
  build          a run's program: `plan` (mesh, batches, task), then `compile_planned` (the
                 compiled steps, the initial state): the one way every caller builds it
  step           the compiled train and eval steps, as the optimization plan composes them
  train          the loop: init, run_start, blocks of training and evaluations, run_stop
  events         the MLPerf event sequence the loop and the dry run write through
  timeline       the run's blocks and their MLPerf metadata; the batches of a global step
  outputs        what a run writes (log, summary.json, checkpoints) and how it ended
  checkpoints    orbax checkpoints of the train state and where the run was
  prefetch       batches prepared and placed ahead of the step
  stops          preemption signals and the metrics window (divergence)
  watchdog       a stuck process caught and ended with one line
  series         --num_runs: the runs of one MLPerf result in one process
  throughput     examples/s, tokens/s and MFU of a step
  compile_only   a run's steps compiled for a TPU slice (or this machine) and what they cost
  compile_cache  compiled programs' facts kept while config and code are unchanged
"""
