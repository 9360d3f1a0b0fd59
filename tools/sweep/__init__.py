"""Sweeps and ablations: optimizations and layouts toggled, measured side by side.

  cli      `./run.sh sweep` (`python -m tools.sweep`): flags and main
  run      a sweep: its settings, variants, resumable state and report
  grid     the variants: optimization sets crossed with layouts
  measure  each variant compiled, timed beside its baseline, compiled for a pod, or trained
  tables   sweep.csv and the Markdown tables
  plots    the PNG plots
  state    sweep.jsonl, what makes a sweep resumable
  ablate   `./run.sh ablate`: each optimization on and off (`python -m tools.sweep.ablate`)
"""
