"""MLPerf logs and what is built from them.

  mlperf      the MLPerf log a run writes (mlperf-logging's `mllog`), held until the setup
              succeeded
  compliance  the official compliance checker over result logs (`./run.sh check`)
  resumed     the verdict on a resumed run's logs (never an MLPerf result)
  observe     TensorBoard events, the PNG of a run, jax.profiler traces
  results     times to train, olympic means, the system description
  package     MLPerf submission packages, checked and scored (`./run.sh package`)
"""
