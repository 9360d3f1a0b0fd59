"""`./run.sh perf`: how fast meshperf is, measured side by side and compared with goals.

  cli           flags and main (`python -m tools.perf`)
  report        the comparisons by name, their goals, perf.md
  timing        interleaved rounds, quartiles, per-round ratios (shared with sweeps)
  handwritten   meshperf's ResNet step against a hand-written one (`vs_handwritten`)
  baseline      that hand-written ResNet step
  loop          the training loop against the bare step; N devices against 1
  pipelines     each input pipeline against its step
  evaluation    seconds per evaluation, split into device, host and data
  compile_time  compile time of each CPU default
"""
