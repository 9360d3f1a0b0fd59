"""A sweep's PNG plots (matplotlib, Agg backend: no display needed), one figure per file, only
those the sweep's depth has figures for:

  step_time.png         median step ms per variant (spread: quartiles of the per-round medians;
                        at pod scale the modelled step)
  examples_per_s.png    global batch / step time
  collective_bytes.png  collective bytes per device per training step, stacked by kind
  memory.png            memory per device: total, arguments, optimizer state, temporaries
  time_to_target.png    seconds to the target per variant: each seed a point, the mean a bar,
                        min-max as the error bar (at pod scale: the predicted minutes)

Bars are coloured by layout (`--layouts`); the ratio to the variant's baseline is written above
each bar where there is one.
"""

from __future__ import annotations

import os
import statistics

from stepmodel.cost import KINDS

_UNITS = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def _unit(largest: float) -> tuple[float, str]:
  return next((s, u) for s, u in _UNITS if largest >= s or s == 1)


def per_variant(rows: list[dict]) -> list[dict]:
  """One row per done variant, in order: a trained variant's step ms is the median over its
  seeds (its compiled figures are the same for every seed)."""
  out: dict[str, dict] = {}
  for r in rows:
    if r["status"] != "done":
      continue
    v = out.setdefault(r["variant"], {**r, "_steps": [], "_runs": []})
    v["_runs"].append(r)
    if r.get("step_ms") is not None:
      v["_steps"].append(r["step_ms"])
  for v in out.values():
    if len(v["_runs"]) > 1 and v["_steps"]:
      v["step_ms"] = statistics.median(v["_steps"])
      v["examples_per_s"] = statistics.median(r["examples_per_s"] for r in v["_runs"]
                                              if r.get("examples_per_s"))
  return list(out.values())


def _axes(plt, n: int, title: str, ylabel: str):
  fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * n + 2.5), 4.4))
  ax.set_title(title, fontsize=10)
  ax.set_ylabel(ylabel)
  ax.grid(True, axis="y", alpha=0.3)
  return fig, ax


def _finish(fig, ax, labels, path: str) -> str:
  ax.set_ylim(top=ax.get_ylim()[1] * 1.18)     # room for the ratios and the legend
  ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  import matplotlib.pyplot as plt
  plt.close(fig)
  return path


def _colors(vs: list[dict]) -> list:
  groups = list(dict.fromkeys(v["group"] for v in vs))
  return [f"C{groups.index(v['group']) % 10}" for v in vs]


def _bars(plt, vs, key, title, ylabel, path, ratio_key=None) -> str:
  fig, ax = _axes(plt, len(vs), title, ylabel)
  bars = ax.bar(range(len(vs)), [v[key] for v in vs], color=_colors(vs))
  for b, v in zip(bars, vs):
    r = v.get(ratio_key) if ratio_key else None
    if r is not None:
      ax.annotate(f"{r:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()),
                  textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
  return _finish(fig, ax, [v["label"] for v in vs], path)


def _ratio_to_base(vs, key, out_key) -> None:
  by = {v["variant"]: v for v in vs}
  for v in vs:
    base = by.get(v["baseline"])
    if v.get(out_key) is None and base and base.get(key) and v.get(key) is not None:
      v[out_key] = v[key] / base[key]


def plot_all(rows: list[dict], output_dir: str, title: str) -> list[str]:
  """Writes the plots the rows have figures for into `output_dir`; returns their paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  vs = per_variant(rows)
  path = lambda name: os.path.join(output_dir, name)  # noqa: E731
  written = []
  timed = [v for v in vs if v.get("step_ms") is not None]
  modelled = [v for v in vs if v.get("model_step_ms") is not None]
  trained = any(v.get("ending") for v in timed)
  if timed and not trained:
    written += _timed(plt, timed, title, path)
  elif timed or modelled:
    # Trained runs (medians over seeds, each run in its own process) or the step-time model:
    # ratios of the figures themselves.
    key, what = ("step_ms", "median over seeds") if timed else ("model_step_ms", "modelled")
    xs = timed or modelled
    _ratio_to_base(xs, key, "_step_ratio")
    _ratio_to_base(xs, "examples_per_s", "_eps_ratio")
    written.append(_bars(plt, xs, key, f"{title}: step time ({what})", "ms per training step",
                         path("step_time.png"), ratio_key="_step_ratio"))
    written.append(_bars(plt, xs, "examples_per_s", f"{title}: training throughput ({what})",
                         "examples / s", path("examples_per_s.png"), ratio_key="_eps_ratio"))
  costed = [v for v in vs if v.get("memory_bytes") is not None or v.get("all_reduce_count")
            is not None]
  if costed:
    written.append(_collectives(plt, costed, title, path("collective_bytes.png")))
    written.append(_memory(plt, costed, title, path("memory.png")))
  trained = [v for v in vs if v.get("ending")]
  if trained:
    written.append(_time_to_target(plt, trained, title, path("time_to_target.png")))
  predicted = [v for v in vs if v.get("predicted_minutes") is not None]
  if predicted and not trained:
    _ratio_to_base(predicted, "predicted_minutes", "minutes_ratio")
    written.append(_bars(plt, predicted, "predicted_minutes",
                         f"{title}: predicted minutes to train (step-time model)", "minutes",
                         path("time_to_target.png"), ratio_key="minutes_ratio"))
  return written


def _paired(plt, vs, title, ylabel, path, value, base_value, ratio, spread=None) -> str:
  """Each variant's figure (error bar: `spread`, (low, high) per variant) beside its baseline's,
  timed in the same rounds (grey), with the paired ratio above it."""
  fig, ax = _axes(plt, len(vs), title, ylabel)
  width = 0.4
  base = [(j - width / 2, b) for j, b in enumerate(base_value) if b is not None]
  xs = [j + (width / 2 if b is not None else 0.0) for j, b in enumerate(base_value)]
  if base:
    ax.bar([x for x, _ in base], [y for _, y in base], width, color="0.75",
           label="its baseline, timed in the same rounds")
  err = None if spread is None else [[max(0.0, y - lo) for y, (lo, _) in zip(value, spread)],
                                     [max(0.0, hi - y) for y, (_, hi) in zip(value, spread)]]
  bars = ax.bar(xs, value, width, yerr=err, capsize=3, color=_colors(vs))
  for j, (b, r) in enumerate(zip(bars, ratio)):
    if r is not None:
      ax.annotate(f"{r:.2f}x", (b.get_x() + b.get_width() / 2,
                                 b.get_height() + (err[1][j] if err else 0.0)),
                  textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
  if base:
    ax.legend(fontsize=8, loc="upper left")
  return _finish(fig, ax, [v["label"] for v in vs], path)


def _timed(plt, vs, title, path_of) -> list[str]:
  """Step time and examples/s of variants timed beside their baselines (medians; the error bar
  of the step: quartiles of the rounds' medians; ratios: medians of the rounds' ratios)."""
  step = [v["step_ms"] for v in vs]
  base = [v.get("baseline_step_ms") for v in vs]
  ratio = [v.get("step_ratio") for v in vs]
  spread = [(v.get("step_ms_q1", v["step_ms"]), v.get("step_ms_q3", v["step_ms"])) for v in vs]
  eps = [v["examples_per_s"] for v in vs]     # global batch / step
  return [
      _paired(plt, vs, f"{title}: step time, each beside its baseline",
              "ms per training step (median)", path_of("step_time.png"), step, base, ratio,
              spread),
      _paired(plt, vs, f"{title}: training throughput, each beside its baseline",
              "examples / s", path_of("examples_per_s.png"), eps,
              [None if b is None else e * s / b for e, s, b in zip(eps, step, base)],
              [None if r is None else 1 / r for r in ratio])]


def _collectives(plt, vs, title, path) -> str:
  kinds = [k for k in KINDS if any(v.get(f"{k.replace('-', '_')}_bytes") for v in vs)]
  totals = [sum(v.get(f"{k.replace('-', '_')}_bytes") or 0 for k in kinds) for v in vs]
  scale, unit = _unit(max(totals + [1]))
  fig, ax = _axes(plt, len(vs), f"{title}: collective bytes per device per training step",
                  unit)
  bottom = [0.0] * len(vs)
  for i, k in enumerate(kinds):
    vals = [(v.get(f"{k.replace('-', '_')}_bytes") or 0) / scale for v in vs]
    ax.bar(range(len(vs)), vals, bottom=bottom, label=k, color=f"C{i}")
    bottom = [a + b for a, b in zip(bottom, vals)]
  if kinds:
    ax.legend(fontsize=8)
  return _finish(fig, ax, [v["label"] for v in vs], path)


def _memory(plt, vs, title, path) -> str:
  parts = [(k, name) for k, name in (("memory_bytes", "total"), ("argument_bytes", "arguments"),
                                     ("opt_state_bytes", "optimizer state"),
                                     ("temp_bytes", "temporaries"))
           if any(v.get(k) is not None for v in vs)]
  scale, unit = _unit(max([v.get(k) or 0 for v in vs for k, _ in parts] + [1]))
  fig, ax = _axes(plt, len(vs), f"{title}: memory per device", unit)
  width = 0.8 / max(1, len(parts))
  for i, (k, name) in enumerate(parts):
    xs = [j + (i - (len(parts) - 1) / 2) * width for j in range(len(vs))]
    ax.bar(xs, [(v.get(k) or 0) / scale for v in vs], width, label=name, color=f"C{i}")
  ax.legend(fontsize=8)
  return _finish(fig, ax, [v["label"] for v in vs], path)


def _time_to_target(plt, vs, title, path) -> str:
  fig, ax = _axes(plt, len(vs), f"{title}: time to target", "seconds (run_start to run_stop)")
  ax.set_xlabel("bar: mean over the seeds that reached the target; error bar: min to max",
                fontsize=8)
  colors = _colors(vs)
  for j, v in enumerate(vs):
    reached = [r["time_to_train_s"] for r in v["_runs"] if r.get("ending") == "success"]
    missed = [r["time_to_train_s"] for r in v["_runs"] if r.get("ending") != "success"]
    if reached:
      mean = statistics.mean(reached)
      ax.bar(j, mean, 0.6, color=colors[j], alpha=0.5,
             yerr=[[mean - min(reached)], [max(reached) - mean]], capsize=4)
      ax.plot([j] * len(reached), reached, "o", color="black", ms=4,
              label="reached the target")
    if missed:
      ax.plot([j] * len(missed), missed, "x", color="red", ms=6, label="did not reach it")
  handles, labels = ax.get_legend_handles_labels()
  if handles:
    ax.legend(dict(zip(labels, handles)).values(), dict(zip(labels, handles)).keys(),
              fontsize=8)
  return _finish(fig, ax, [v["label"] for v in vs], path)
