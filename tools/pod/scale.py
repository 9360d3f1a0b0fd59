"""Runs on TPU slices and GPU hosts, predicted from their compiled programs:
`./run.sh scale <benchmark>|all`.

  ./run.sh scale all [--points=FILE] [--chips=16,64] [--output_dir=runs/scale] [--plot=PATH.png]
                     [--cache_dir=runs/compile_cache] [--refresh] [--fit [--fit_on=16]]
                     [--host_fit_on=ssd-16,ssd-128]

Each point of the points file (`tools.pod.points`; by default Google's 18 MLPerf v0.6
TPU-v3 submissions, 16 to 1024 chips, from their logs) names a benchmark, a preset with its
overrides, a TPU slice, the steps and evaluations of the run and, optionally, what was measured.
For every point it compiles the real train and eval steps for the slice (libtpu, no TPU needed;
`harness.compile_only`), prices them with the step-time model (`stepmodel.steptime`: each
kernel's FLOPs and HBM bytes, the collectives on the slice's torus, the compiled schedule) and
predicts the run:

  minutes = (startup_s + train_steps x step + evaluations x eval_steps x eval step
             + final_scoring_s) / 60

with the host terms the point declares (`host`: time on the host inside the timed run that no
device program shows). Where the points file fits a hosts' input line (`--host_fit_on`, or the
file's own `host_fit_on`: two or more points of one accelerator and benchmark whose measured
steps follow the images each host feeds), a point's step is no faster than its hosts make their
shares of the batch: max(device step, fixed + per image x images a host; `stepmodel.host`), and
the points fitted on count as fitted. It prints, per point, the measured and modelled train step
with their ratio and model FLOPs utilization (the benchmark's analytic FLOPs of the point's
batch over the slice's bf16 peak, at each step time), the published and modelled minutes with
their ratio, and the mean absolute percentage error (MAPE) of both over the points the model's
constants were fitted on and over the held-out ones; it writes
`<output_dir>/scale_<benchmark>.json` (per point: `modelled_step_ms`, `measured_step_ms`,
`modelled_mfu`, `measured_mfu`, `modelled_minutes`, `published_minutes`, their ratios, the
model's terms and the full compile summary) and a PNG (`--plot`): modelled against measured
steps, and the minutes per slice.

`--fit` fits the model's constants for each TPU generation or GPU (`accelerators.Calibration`:
the per-kernel overhead, the achieved fraction of HBM bandwidth, and the ICI latency on a TPU or
the achieved fraction of the tensor cores' peak on a GPU; at most three) to the measured steps
of the points `--fit_on` names (chip counts or point names), prints them and uses them for this
run; `--fit_on=each` predicts every point with constants fitted on the others of its
accelerator (leave one out: each point held out of its own fit). A points file may carry its
own `"fit_on"` (the H200's file says "each"), which is then the default. The constants the
model uses by default are the accelerator's, in `stepmodel/accelerators.py`, where a fit is
recorded. GPU points compile through JAX's CUDA plugin (`./run.sh install cuda12`).

Cache: a full-size compile takes 1 to 6 minutes on a 2-core machine; compiled programs are kept
in `--cache_dir` (`harness.compile_cache`: keyed by benchmark, config, topology and
compiler versions, checked file by file against the code that compiled them). A rerun with
nothing changed compiles nothing; a change to the step-time model re-reads the cached programs;
a change to the code a benchmark runs recompiles it. `--refresh` recompiles regardless.

Compiler flags: libtpu reads its flags (LIBTPU_INIT_ARGS) once per process, and a preset may
set some (`libtpu_flags`: the v3 pod presets' asynchronous collectives). A point whose flags
differ from those this process's libtpu loaded with is compiled in a child process started with
its own (`tools.pod.compile_point`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

from absl import flags

from benchmarks import config as config_lib
from harness import cli, compile_only, options
from harness import flags as flags_lib
from harness import run as runs
from harness.options import flag
from runtime import tpu_flags
from runtime.errors import UserError
from stepmodel import accelerators, gpu, steptime, topology
from stepmodel import host as host_model
from tools.pod import compile_point
from tools.pod import points as points_lib
from tools.pod.points import Point

WITHIN = 0.10                      # |modelled / measured - 1| within this counts as a match
EACH = "each"                      # --fit_on=each: every point on constants fitted on the others

@dataclasses.dataclass(frozen=True)
class ScaleOptions:
  """`./run.sh scale`'s flags (`harness.flags.define_options`)."""
  points: str = flag(points_lib.DEFAULT, "The points file (JSON, tools/pod/points.py): by "
                     "default Google's MLPerf v0.6 TPU-v3 submissions.")
  chips: str = flag("", "Only the points on slices of these many chips (comma-separated; "
                    "default: every point).")
  output_dir: str = flag(os.path.join("runs", "scale"), "Where scale_<benchmark>.json and the "
                         "plot go.")
  plot: str | None = flag(None, "PNG path of the plot (default "
                          "<output_dir>/scale_<benchmark>.png).")
  cache_dir: str = flag(os.path.join("runs", "compile_cache"), "Compile summaries by key "
                        "(module docstring).")
  refresh: bool = flag(False, "Recompile every point, ignoring the cache.")
  with_eval: bool = flag(True, "Compile and time the eval step too.")
  overlap: str = flag("schedule", "Which reading of the step-time model is the step: the "
                      "compiled schedule's, or its bounds none (collectives after the kernels) "
                      "and full (collectives hidden behind them).",
                      choices=("schedule", "none", "full"))
  fit: bool = flag(False, "Fit the model's constants on the --fit_on points' measured steps "
                   "and use them (module docstring).")
  fit_on: str = flag("16", "With --fit: the points to fit on, as chip counts or point names "
                     "(comma-separated), or `each`: every point predicted by constants fitted on "
                     "the others (leave one out). A points file's own `fit_on` is the default "
                     "for it.")
  host_fit_on: str = flag("", "Fit the hosts' input term (stepmodel/host.py: a step no faster "
                          "than fixed + per image x images a host feeds) on these points' "
                          "measured steps, two or more per accelerator and benchmark (point "
                          "names or chip counts), and floor every point of theirs that says "
                          "how many hosts feed it; '' for none. A points file's own "
                          "`host_fit_on` is the default for it.")


# --- points (no jax) ----------------------------------------------------------------------------

def select(all_points: list[Point], benchmark: str, chips: list[int] | None = None
           ) -> list[Point]:
  """The points of one benchmark (or `all`), optionally only those on some slice sizes."""
  names = sorted({p.benchmark for p in all_points})
  if benchmark != "all" and benchmark not in names:
    raise UserError(f"scale {benchmark}: the points file has no {benchmark} point; choose one of "
                    f"{', '.join(names)} or all")
  chosen = [p for p in all_points if benchmark in ("all", p.benchmark)]
  if chips:
    have = sorted({p.chips for p in chosen})
    missing = [c for c in chips if c not in have]
    if missing:
      raise UserError(f"--chips={','.join(map(str, missing))}: the points of {benchmark} are on "
                      f"{', '.join(map(str, have))} chips")
    chosen = [p for p in chosen if p.chips in chips]
  return chosen


def parse_chips(text: str) -> list[int]:
  try:
    return [int(t) for t in text.split(",") if t.strip()]
  except ValueError:
    raise UserError(f"--chips={text}: comma-separated integers, e.g. 16,64") from None


def _wanted(text: str) -> list[str]:
  return [t.strip() for t in text.split(",") if t.strip()]


def _named(points: list[Point], text: str, flag: str) -> list[Point]:
  """The points `flag` names (point names or chip counts), each with a measured step."""
  wanted = _wanted(text)
  picked = [p for p in points if p.name in wanted or str(p.chips) in wanted]
  if not picked:
    raise UserError(f"{flag}={text}: no chosen point has these chip counts or names")
  bare = [p.name for p in picked if not p.measured_step_ms]
  if bare:
    raise UserError(f"{flag}={text}: {', '.join(bare)} has no measured train_step_ms")
  return picked


def fit_set(chosen: list[Point], text: str) -> list[Point] | str:
  """The points `--fit_on` names (chip counts or point names), among those chosen; "each"
  (leave one out) as it is, when two or more chosen points have a measured step."""
  if text.strip() == EACH:
    if sum(1 for p in chosen if p.measured_step_ms) < 2:
      raise UserError(f"--fit_on={EACH} fits each point on the others: choose at least two "
                      f"points with a measured train_step_ms")
    return EACH
  return _named(chosen, text, "--fit_on")


def _host_fit_set(every: list[Point], text: str) -> list[Point]:
  """The points of the file `--host_fit_on` names (point names or chip counts): chosen or not,
  since the fit reads their measured steps only."""
  unknown = [w for w in _wanted(text) if not any(w in (p.name, str(p.chips)) for p in every)]
  if unknown:
    raise UserError(f"--host_fit_on={text}: the points file has no point named or on "
                    f"{', '.join(unknown)} chips")
  return _named(every, text, "--host_fit_on")


# --- the prediction -----------------------------------------------------------------------------

def predict(point: Point, summary: dict, fitted: bool = False,
            host: host_model.HostInput | None = None) -> dict[str, Any]:
  """Minutes for the point's steps and evaluations at the modelled step times, beside what
  was measured and published. With `host`, the step is no faster than the point's hosts make
  their shares of the batch (`stepmodel.host`)."""
  train = (summary.get("train") or {}).get("model")
  if not train:
    raise UserError(f"{point.name}: the compile summary has no step-time model (was it compiled "
                    f"for a TPU topology, and did it fit?)")
  evals = (summary.get("eval") or {}).get("model")
  device_s = train["step_s"]
  host_s = host.step_s(point.images_per_host) if host and point.images_per_host else None
  step_s = max(device_s, host_s or 0.0)
  host_fitted = bool(host_s) and point.name in host.fitted_on
  eval_step_s = evals["step_s"] if evals else 0.0
  eval_steps = point.eval_steps or summary["dataset"]["eval_steps"]
  terms = {"startup_s": point.host.get("startup_s", 0.0),
           "train_s": point.train_steps * step_s,
           "eval_s": point.evaluations * eval_steps * eval_step_s,
           "final_scoring_s": point.host.get("final_scoring_s", 0.0)}
  minutes = sum(terms.values()) / 60
  measured = point.measured_step_ms
  published = point.published_minutes
  mfu = (summary.get("prediction") or {}).get("mfu")
  eval_s = eval_steps * eval_step_s
  measured_eval = point.measured.get("eval_on_device_s")
  return {
      "modelled_step_ms": step_s * 1e3, "measured_step_ms": measured,
      "step_ratio": step_s * 1e3 / measured if measured else None,
      "modelled_device_step_ms": device_s * 1e3,
      "modelled_host_step_ms": None if host_s is None else host_s * 1e3,
      "bound": "host" if host_s and host_s > device_s else "device",
      "host_input": None if host_s is None else dataclasses.asdict(host)
      | {"images_per_host": point.images_per_host},
      "modelled_eval_s": eval_s, "measured_eval_s": measured_eval,
      "eval_ratio": eval_s / measured_eval if measured_eval else None,
      "modelled_minutes": minutes, "published_minutes": published,
      "minutes_ratio": minutes / published if published else None,
      # fitted: the point's measured step set constants it is predicted with (the device's or
      # its hosts'); held out otherwise
      "fitted": fitted or host_fitted, "device_fitted": fitted, "host_fitted": host_fitted,
      "eval_steps": eval_steps, "eval_step_ms": eval_step_s * 1e3,
      "train_steps": point.train_steps, "evaluations": point.evaluations,
      "minutes_terms": {k: v / 60 for k, v in terms.items()},
      "step_terms": {k: train[k] for k in ("kernels", "kernel_s", "compute_s", "memory_s",
                                           "vector_s", "overhead_s", "collective_s",
                                           "exposed_collective_s", "compiler_estimate_s")},
      "bounds_ms": {k: v * 1e3 for k, v in train["bounds"].items()},
      "calibration": train["calibration"], "fits": summary.get("fits"),
      # `mfu` is the model FLOPs at the device's step (`compile_only.utilization`): the same
      # FLOPs at the (floored) modelled step and at Google's measured one.
      "modelled_mfu": mfu * device_s / step_s if mfu else None,
      "measured_mfu": mfu * device_s * 1e3 / measured if mfu and measured else None,
  }


# LIBTPU_INIT_ARGS as the user set it, before any point added its preset's `libtpu_flags`.
_USER_LIBTPU_ARGS = os.environ.get("LIBTPU_INIT_ARGS", "")


def _compiled(point: Point, cfg, *, with_eval, say, cache_dir, refresh):
  # Before jax starts: the host backend stays on CPU; naming the slice keeps libtpu quiet.
  topo = topology.parse(point.topology)
  topology.prepare_host(topo)
  want = tpu_flags.merged(cfg.libtpu_flags, _USER_LIBTPU_ARGS)
  here = " ".join(os.environ.get(tpu_flags.VARIABLE, "").split())
  if topo.platform == "tpu" and tpu_flags.loaded() and want != here:
    # This process's libtpu loaded with another point's flags (it reads them once).
    raw = compile_point.in_child(point, want, with_eval=with_eval, say=say,
                                 cache_dir=cache_dir, refresh=refresh)
  else:
    if topo.platform == "tpu" and want != here:
      tpu_flags.check(cfg.libtpu_flags)
      os.environ[tpu_flags.VARIABLE] = want
    run = runs.on_slice(point.entry, cfg, point.topology)
    raw = compile_only.facts(run, with_eval=with_eval, say=say, cache_dir=cache_dir,
                             refresh=refresh)
  return raw, compile_only.read(raw, cfg)


def accelerator(topology_name: str):
  """The table row a point's topology runs on: a TPU `Generation` or a `Gpu` (each has a
  `name` and a `calibration`)."""
  topo = topology.parse(topology_name)
  if topo.platform == "gpu":
    return accelerators.gpu(topo.generation)
  return accelerators.GENERATIONS[topo.generation]


def _fit_one(prepared_pairs, say) -> accelerators.Calibration:
  """One accelerator's constants fitted on [(prepared, measured seconds, point name)]."""
  pairs = [(p, m) for p, m, _ in prepared_pairs]
  label = ", ".join(n for _, _, n in prepared_pairs)
  names = [n for _, _, n in prepared_pairs]
  if isinstance(prepared_pairs[0][0], gpu.Prepared):
    cal = gpu.fit(pairs, label=label, points=names)
    say(f"fitted on {cal.fitted_on}: {cal.kernel_overhead_s * 1e6:.2f} us per kernel, "
        f"{cal.hbm_efficiency:.1%} of the HBM bandwidth, {cal.matrix_efficiency:.1%} of the "
        f"tensor cores' peak")
  else:
    cal = steptime.fit(pairs, label=label, points=names)
    say(f"fitted on {cal.fitted_on}: {cal.kernel_overhead_s * 1e6:.2f} us per kernel, "
        f"{cal.hbm_efficiency:.1%} of the HBM bandwidth, {cal.ici_latency_s * 1e6:.2f} us per "
        f"ICI step")
  return cal


def _fit(compiled: list[tuple[Point, Any]], fit_on: list[Point] | str,
         say: Callable[[str], None]) -> dict[str, accelerators.Calibration]:
  """Each point's calibration: its accelerator's, fitted on the measured steps of `fit_on`;
  or, with `fit_on` "each" (leave one out), fitted on the other measured points of its
  accelerator, so that every point is held out of its own fit."""
  by_acc: dict[str, list] = {}
  for point, (_, steps) in compiled:
    if point.measured_step_ms and steps["train"] is not None:
      by_acc.setdefault(accelerator(point.topology).name, []).append(
          (steps["train"][1], point.measured_step_ms / 1e3, point.name))
  out = {}
  if fit_on == EACH:
    for point, _ in compiled:
      others = [t for t in by_acc.get(accelerator(point.topology).name, []) if t[2] != point.name]
      if others:
        say(f"{point.name}: held out")
        cal = _fit_one(others, say)
        out[point.name] = dataclasses.replace(cal, points=())
    return out
  names = {p.name for p in fit_on}
  for acc, triples in by_acc.items():
    mine = [t for t in triples if t[2] in names]
    if mine:
      cal = _fit_one(mine, say)
      out.update({p.name: cal for p, _ in compiled if accelerator(p.topology).name == acc})
  return out


def host_fits(chosen: list[Point], fit_on: list[Point], say: Callable[[str], None]
              ) -> dict[str, host_model.HostInput]:
  """Each chosen point's hosts' input term, fitted on the `fit_on` points of its accelerator
  and benchmark (`stepmodel.host.fit`); points of a group with no fitted point have none."""
  groups: dict[tuple[str, str], list[Point]] = {}
  for p in fit_on:
    if p.images_per_host is None:
      raise UserError(f"--host_fit_on: {p.name} does not say how many hosts feed it "
                      f"(host.input_hosts in the points file)")
    groups.setdefault((accelerator(p.topology).name, p.benchmark), []).append(p)
  out = {}
  for (acc, benchmark), mine in groups.items():
    names = ", ".join(p.name for p in mine)
    try:
      line_ = host_model.fit([(p.images_per_host, p.measured_step_ms / 1e3, p.name)
                              for p in mine])
    except ValueError as e:
      raise UserError(f"--host_fit_on: {benchmark} on {acc} from {names}: {e}") from None
    say(f"{benchmark} on {acc}'s hosts, fitted on {names}: {line_.fixed_s * 1e3:.2f} ms a "
        f"step + {line_.per_image_s * 1e3:.3f} ms an image a host "
        f"({1 / line_.per_image_s:,.0f} images/s a host)")
    out.update({p.name: line_ for p in chosen if p.benchmark == benchmark
                and accelerator(p.topology).name == acc and p.images_per_host})
  return out


def run(chosen: list[Point], output_dir: str, plot_path: str | None, cache_dir: str,
        refresh: bool = False, with_eval: bool = True, say: Callable[[str], None] = print,
        overlap: str = "schedule", fit_on: list[Point] | str | None = None,
        compiled: Callable | None = None, host_fit_on: list[Point] | None = None
        ) -> dict[str, list[dict]]:
  """Predicts every point (compiled from the cache where it can), prints the table, writes the
  JSON and the plot. `compiled(point, cfg, ...)` -> (raw facts, `compile_only.read`) defaults to
  compiling (tests pass a stand-in); `fit_on`: fit the constants on these points first, or
  "each": every point on constants fitted on the others; `host_fit_on`: fit the hosts' input
  term on these points (`host_fits`)."""
  hosts = host_fits(chosen, host_fit_on, say) if host_fit_on else {}
  compiled = compiled or _compiled
  done = []
  for point in chosen:
    cfg = points_lib.config(point)
    say(f"{point.name}: {point.benchmark} on {point.topology} ...")
    done.append((point, (cfg, *compiled(point, cfg, with_eval=with_eval, say=say,
                                        cache_dir=cache_dir, refresh=refresh))))
  calibrations = _fit([(p, c[1:]) for p, c in done], fit_on, say) if fit_on else {}
  rows: dict[str, list[dict]] = {}
  for point, (cfg, raw, steps) in done:
    cal = calibrations.get(point.name, accelerator(point.topology).calibration)
    summary = compile_only.summarize(raw, cfg, overlap, cal, steps)
    fitted = point.name in cal.points
    row = {"point": dataclasses.asdict(point) | {"chips": point.chips},
           "prediction": predict(point, summary, fitted, hosts.get(point.name)),
           "summary": summary}
    rows.setdefault(point.benchmark, []).append(row)
    say(line(row))
  os.makedirs(output_dir, exist_ok=True)
  for name, bm_rows in rows.items():
    say(f"\n{name}: train step and minutes from run_start to run_stop, measured and modelled")
    say(table(bm_rows))
  every = [r for bm_rows in rows.values() for r in bm_rows]
  say("\n" + errors(every))
  label = next(iter(rows)) if len(rows) == 1 else "all"
  out = os.path.join(output_dir, f"scale_{label}.json")
  with open(out, "w") as f:
    json.dump({"benchmarks": rows, "within": WITHIN, "mape": mapes(every),
               "at_or_below_measured": at_or_below(every),
               "fit_on": fit_on if isinstance(fit_on, str) or fit_on is None
               else [p.name for p in fit_on],
               "host_fit_on": [p.name for p in host_fit_on or []]}, f, indent=1, default=float)
  png = plot_path or os.path.join(output_dir, f"scale_{label}.png")
  plot(rows, png)
  say(f"wrote {out} and {png}")
  return rows


# --- output -------------------------------------------------------------------------------------

HEAD = ("point", "topology", "batch", "measured step ms", "modelled step ms", "ratio",
        "measured MFU", "modelled MFU", "published min", "modelled min", "ratio", "fitted")


def _ratio(x) -> str:
  return "" if x is None else f"{x:.2f}"


def _percent(x) -> str:
  return "" if x is None else f"{x:.1%}"


def _cells(row: dict) -> tuple[str, ...]:
  point, p = row["point"], row["prediction"]
  fit = "" if p["fits"] is not False else " (no fit)"
  batch = point["overrides"].get("global_batch_size", "")
  return (point["name"], point["topology"], str(batch),
          "" if p["measured_step_ms"] is None else f"{p['measured_step_ms']:.1f}",
          f"{p['modelled_step_ms']:.1f}{fit}{' host' if p.get('bound') == 'host' else ''}",
          _ratio(p["step_ratio"]),
          _percent(p.get("measured_mfu")), _percent(p.get("modelled_mfu")),
          "" if p["published_minutes"] is None else f"{p['published_minutes']:.2f}",
          f"{p['modelled_minutes']:.2f}", _ratio(p["minutes_ratio"]),
          "host fit" if p.get("host_fitted") else "fitted" if p["fitted"] else "held out")


def line(row: dict) -> str:
  return "  " + ", ".join(f"{h} {c}" for h, c in zip(HEAD, _cells(row)) if c)


def table(rows: list[dict]) -> str:
  cells = [HEAD] + [_cells(r) for r in rows]
  widths = [max(len(c[i]) for c in cells) for i in range(len(HEAD))]

  def fmt(c):
    return "| " + " | ".join(x.rjust(w) for x, w in zip(c, widths)) + " |"
  return "\n".join([fmt(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
                   + [fmt(c) for c in cells[1:]])


def _mape_groups(rows: list[dict]) -> dict[str, Any]:
  out = {}
  for group in ("fitted", "held_out"):
    mine = [r["prediction"] for r in rows if r["prediction"]["fitted"] == (group == "fitted")]
    for what, model, truth in (("step", "modelled_step_ms", "measured_step_ms"),
                               ("minutes", "modelled_minutes", "published_minutes")):
      pairs = [(p[model], p[truth]) for p in mine if p[truth]]
      out[f"{group}_{what}"] = {
          "points": len(pairs), "mape_pct": points_lib.mape(pairs),
          "within": sum(abs(m / t - 1) <= WITHIN for m, t in pairs)}
  return out


def mapes(rows: list[dict]) -> dict[str, Any]:
  """MAPE (%) of the step and of the minutes over the fitted and the held-out points, with
  how many points each has and how many are within WITHIN; the same per benchmark."""
  names = list(dict.fromkeys(r["point"]["benchmark"] for r in rows))
  return {**_mape_groups(rows), "by_benchmark": {
      n: _mape_groups([r for r in rows if r["point"]["benchmark"] == n]) for n in names}}


def at_or_below(rows: list[dict]) -> dict[str, list[int]]:
  """[points whose modelled step is at most the measured one, points with a measured step],
  over all points and per benchmark: how many of meshperf's programs would be as fast as
  Google's measured steps on the same slices."""
  def count(mine):
    ratios = [r["prediction"]["modelled_step_ms"] / r["prediction"]["measured_step_ms"]
              for r in mine if r["prediction"]["measured_step_ms"]]
    return [sum(x <= 1.0 for x in ratios), len(ratios)]
  names = list(dict.fromkeys(r["point"]["benchmark"] for r in rows))
  return {"all points": count(rows),
          **{n: count([r for r in rows if r["point"]["benchmark"] == n]) for n in names}}


def errors(rows: list[dict]) -> str:
  m = mapes(rows)
  lines = [f"{label:>12}: {k} of {n} points' modelled step at or below the measured step"
           for label, (k, n) in at_or_below(rows).items() if n]
  for label, groups in [("all points", m)] + list(m["by_benchmark"].items()):
    for key, v in groups.items():
      if key == "by_benchmark" or not v["points"]:
        continue
      group, what = key.rsplit("_", 1)
      lines.append(f"{label:>12}: {what:>7} MAPE over the {v['points']} "
                   f"{group.replace('_', '-')} points: {v['mape_pct']:.1f}% ({v['within']} "
                   f"within {WITHIN:.0%})")
  return "\n".join(lines)


def plot(rows: dict[str, list[dict]], path: str) -> None:
  """Modelled against measured train steps (all benchmarks), then the minutes per slice, one
  panel per benchmark."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import FuncFormatter
  fig, axes = plt.subplots(1, len(rows) + 1, figsize=(5.2 * (len(rows) + 1), 4.4),
                           squeeze=False)
  ax = axes[0][0]
  steps = [(r["prediction"]["measured_step_ms"], r["prediction"]["modelled_step_ms"], name,
            r["prediction"]["fitted"]) for name, bm_rows in rows.items() for r in bm_rows
           if r["prediction"]["measured_step_ms"]]
  if steps:
    lo = min(min(a, b) for a, b, _, _ in steps) / 1.3
    hi = max(max(a, b) for a, b, _, _ in steps) * 1.3
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="modelled = measured")
    ax.fill_between([lo, hi], [lo * (1 - WITHIN), hi * (1 - WITHIN)],
                    [lo * (1 + WITHIN), hi * (1 + WITHIN)], color="0.85",
                    label=f"within {WITHIN:.0%}")
    for i, name in enumerate(rows):
      for fitted, marker in ((False, "o"), (True, "*")):
        mine = [(a, b) for a, b, n, f in steps if n == name and f == fitted]
        if mine:
          ax.plot(*zip(*mine), marker, color=f"C{i}", ms=11 if fitted else 6, ls="none",
                  label=f"{name}{' (fitted)' if fitted else ''}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
  ax.set_xlabel("measured train step (ms)")
  ax.set_ylabel("modelled train step (ms)")
  ax.set_title("train step")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7)
  for ax, (name, bm_rows) in zip(axes[0][1:], rows.items()):
    chips = [r["point"]["chips"] for r in bm_rows]
    published = [r["prediction"]["published_minutes"] for r in bm_rows]
    modelled = [r["prediction"]["modelled_minutes"] for r in bm_rows]
    if all(published):
      ax.plot(chips, published, "o-", label="published")
    ax.plot(chips, modelled, "s--", label="modelled (compiled steps x the run's steps)")
    for c, r in zip(chips, bm_rows):
      if r["prediction"]["minutes_ratio"]:
        ax.annotate(f"{r['prediction']['minutes_ratio']:.2f}x",
                    (c, r["prediction"]["modelled_minutes"]), textcoords="offset points",
                    xytext=(4, 6), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xticks(sorted(set(chips)), [str(c) for c in sorted(set(chips))])
    ax.set_xlabel("chips")
    ax.set_ylabel("minutes to train")
    ax.set_title(name)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)


# --- command line -------------------------------------------------------------------------------

def _parse_error(e: flags.Error, fv: flags.FlagValues) -> UserError:
  hint = f"`./run.sh scale --help` lists its flags ({', '.join('--' + n for n in fv)})"
  return UserError(flags_lib.bad_value(e, fv) or f"{str(e).splitlines()[0]}; {hint}")


def given(fv: flags.FlagValues) -> set[str]:
  """The flags the command line set."""
  return {name for name in fv if fv[name].present}


def check_outputs(o: ScaleOptions) -> None:
  """Where the results go can be written, checked before minutes of compiling."""
  config_lib.check_writable("--output_dir", o.output_dir)
  if o.plot:
    config_lib.check_writable("--plot", o.plot, kind="file")
  if o.cache_dir:
    config_lib.check_writable("--cache_dir", o.cache_dir)


def main(argv: list[str]) -> int:
  fv = flags.FlagValues()           # a fresh set per call
  flags_lib.define_options(ScaleOptions, fv)
  rest = argv[1:]
  if any(a in ("--help", "-h", "--helpfull") for a in rest):
    print(__doc__.split("\n\n")[1] + "\n\nflags:\n" + fv.get_help(include_special_flags=False))
    return 0
  if not rest or rest[0].startswith("-"):
    raise UserError("name a benchmark: run.sh scale <benchmark>|all [--points=FILE] "
                    "[--chips=16,64]")
  try:
    extra = fv([argv[0]] + rest[1:])[1:]
  except flags.Error as e:
    raise _parse_error(e, fv) from None
  if extra:
    raise UserError(f"unexpected argument '{extra[0]}'; flags are written --name=value")
  o = options.from_flags(ScaleOptions, fv)
  every = points_lib.load(o.points)
  chosen = select(every, rest[0], parse_chips(o.chips))
  # A points file may name how its points are fitted (`fit_on`: the H200's, "each").
  own, set_here = points_lib.file_fit_on(o.points), given(fv)
  fit = o.fit or (own is not None and "fit" not in set_here)
  text = o.fit_on if own is None or "fit_on" in set_here else own
  fit_on = fit_set(chosen, text) if fit else None
  own_host = points_lib.file_fit_on(o.points, "host_fit_on")
  host_text = o.host_fit_on if own_host is None or "host_fit_on" in set_here else own_host
  host_fit_on = _host_fit_set(every, host_text) if host_text.strip() else None
  check_outputs(o)
  run(chosen, o.output_dir, o.plot, o.cache_dir, o.refresh, o.with_eval, overlap=o.overlap,
      fit_on=fit_on, host_fit_on=host_fit_on)
  return 0

if __name__ == "__main__":
  cli.run_main(main)
