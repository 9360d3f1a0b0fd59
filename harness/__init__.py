"""The training loop and what it is made of.

  build        a run's program: mesh, layout, plan, task, compiled steps, initial state (the one
               way every caller builds it)
  step         the compiled train and eval steps, as the optimization plan composes them
  train        the loop: init, run_start, blocks of training and evaluations, run_stop
  timeline     the run's blocks and their MLPerf metadata; the batches of a global step
  outputs      what a run writes (log, summary.json, checkpoints) and how it ended
  checkpoints  orbax checkpoints of the train state and where the run was
  prefetch     batches prepared and placed ahead of the step
  stops        preemption signals and the metrics window (divergence)
  series       --num_runs: the runs of one MLPerf result in one process
"""
