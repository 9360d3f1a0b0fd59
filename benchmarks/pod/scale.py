"""Google's MLPerf v0.6 TPU-v3 scaling curve, predicted: `./run.sh scale <benchmark>`.

  ./run.sh scale resnet [--chips=16,64,128,256,512,1024] [--output_dir=runs/scale]
                        [--plot=PATH.png] [--cache_dir=runs/compile_cache] [--refresh]
  ./run.sh scale all    (resnet, ssd and transformer; one plot with three panels)

For every slice Google submitted (`benchmarks.pod.scale_points`: 16 to 1024 chips) it builds the
benchmark's `tpu-v3-2048` preset with that submission's batch, hyperparameters, mesh and
evaluation cadence, compiles the real train and eval steps for the slice
(`benchmarks.pod.compile_only.analyze`, libtpu, no TPU needed) and times the run the way those
submissions ran it:

  minutes = (train_steps x modelled step time + evaluations x eval steps x modelled eval step
             time) / 60

where train_steps and evaluations are the means over Google's result logs up to the evaluation
that reached the target (their steps, at their batch), and the step times come from
`mesh.steptime` via compile_only (`summary["prediction"]["step_s"]`, `["eval_step_s"]`). Init,
host input and compilation are not timed (MLPerf's clock starts at run_start). It prints the
predicted minutes beside the published ones with their ratio, and writes
`<output_dir>/scale_<benchmark>.json` (every point: Google's figures, the config, the full
compile summary, the prediction) and a log-log PNG of both curves (`--plot`, default
`<output_dir>/scale_<benchmark>.png`).

Cache: a full-size compile takes 1 to 6 minutes on a 2-core machine; compiled programs are kept
in `--cache_dir` (`benchmarks.pod.compile_cache`: keyed by benchmark, config, topology and compiler
versions, checked file by file against the code that compiled them). A rerun with nothing
changed compiles nothing; a change to the step-time model re-reads the cached programs; a change
to the code a benchmark runs recompiles it. `--refresh` recompiles regardless.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

from absl import flags

from benchmarks import config as config_lib
from benchmarks import flags as flags_lib
from benchmarks import registry
from benchmarks.pod.scale_points import CHIPS, POINTS, Point
from mesh.errors import UserError

PRESET = "tpu-v3-2048"
WITHIN = 0.30                      # |predicted / published - 1| within this counts as a match

# `./run.sh scale`'s flags: (kind, name, default, help[, enum values]), `benchmarks.flags.define`.
FLAGS = (
    ("string", "chips", ",".join(map(str, CHIPS)), "Slices to predict, in chips "
     "(comma-separated; Google submitted 16, 64, 128, 256, 512, 1024)."),
    ("string", "output_dir", os.path.join("runs", "scale"),
     "Where scale_<benchmark>.json and the plot go."),
    ("string", "plot", None, "PNG path of the plot (default <output_dir>/scale_<benchmark>.png)."),
    ("string", "cache_dir", os.path.join("runs", "compile_cache"),
     "Compile summaries by key (module docstring)."),
    ("bool", "refresh", False, "Recompile every point, ignoring the cache."),
    ("bool", "with_eval", True, "Compile and time the eval step too."),
    ("enum", "overlap", "none", "The step-time model's overlap of collectives with compute: none "
     "(upper bound) or full (lower bound).", ["none", "full"]),
)


# --- points and configs (no jax) ----------------------------------------------------------------

def select(benchmark: str, chips: list[int] | None = None) -> list[Point]:
  """The points of one benchmark (or `all`), optionally only some slice sizes."""
  names = list(POINTS) if benchmark == "all" else [benchmark]
  for name in names:
    if name not in POINTS:
      known = ", ".join(POINTS)
      why = ("no MLPerf v0.6 TPU result to compare with" if name in registry.BENCHMARKS
             else "unknown benchmark")
      raise UserError(f"scale {name}: {why}; choose one of {known} or all")
  for c in chips or ():
    if c not in CHIPS:
      raise UserError(f"--chips={c}: Google's v0.6 TPU-v3 results are for "
                      f"{', '.join(map(str, CHIPS))} chips")
  return [POINTS[n][c] for n in names for c in (chips or CHIPS)]


def parse_chips(text: str) -> list[int]:
  try:
    chips = [int(t) for t in text.split(",") if t.strip()]
  except ValueError:
    raise UserError(f"--chips={text}: comma-separated integers, e.g. 16,64") from None
  if not chips:
    raise UserError("--chips is empty")
  return chips


def point_config(point: Point):
  """The benchmark's tpu-v3-2048 preset with the point's overrides."""
  mod = registry.BENCHMARKS[point.benchmark].config()
  return config_lib.replace(config_lib.preset(mod.PRESETS, PRESET, point.benchmark),
                            point.overrides)


def validate(point: Point, cfg) -> None:
  config_lib.validate_common(cfg)
  registry.BENCHMARKS[point.benchmark].config().validate(cfg)


# --- the prediction -----------------------------------------------------------------------------

def predict(point: Point, summary: dict) -> dict[str, Any]:
  """Minutes for Google's steps and evaluations at the compiled step times."""
  model = summary.get("prediction")
  if not model:
    raise UserError(f"{point.benchmark} at {point.chips} chips: the compile summary has no "
                    f"step-time model (was it compiled for a TPU topology?)")
  step_s, eval_step_s, eval_steps = model["step_s"], model["eval_step_s"], model["eval_steps"]
  train_min = point.train_steps * step_s / 60
  eval_min = point.evaluations * eval_steps * eval_step_s / 60
  minutes = train_min + eval_min
  ratio = minutes / point.published_minutes
  return {"step_s": step_s, "eval_step_s": eval_step_s, "eval_steps": eval_steps,
          "train_steps": point.train_steps, "evaluations": point.evaluations,
          "train_minutes": train_min, "eval_minutes": eval_min, "minutes": minutes,
          "published_minutes": point.published_minutes, "ratio": ratio,
          "within_30pct": abs(ratio - 1) <= WITHIN, "fits": summary.get("fits"),
          "compile_only_minutes": model.get("minutes")}


def run(points: list[Point], output_dir: str, plot_path: str | None, cache_dir: str,
        refresh: bool = False, with_eval: bool = True, analyze: Callable | None = None,
        say: Callable[[str], None] = print, overlap: str = "none") -> dict[str, list[dict]]:
  """Predicts every point (from the cache where it can), prints the table, writes the JSON
  and the plot. `analyze` defaults to compile_only.analyze (tests pass a stand-in)."""
  rows: dict[str, list[dict]] = {}
  for point in points:
    cfg = point_config(point)
    validate(point, cfg)
    if analyze is None:
      analyze = _compile_only_analyze(point.topology)
    say(f"{point.benchmark} {point.chips} chips ({point.topology}) ...")
    summary = analyze(point.benchmark, cfg, point.topology, with_eval=with_eval, say=say,
                      overlap=overlap,
                      cache_dir=cache_dir, refresh=refresh)
    row = {"point": dataclasses.asdict(point), "prediction": predict(point, summary),
           "summary": summary}
    rows.setdefault(point.benchmark, []).append(row)
    say(line(row))
  os.makedirs(output_dir, exist_ok=True)
  for name, bm_rows in rows.items():
    say(f"\n{name}: MLPerf v0.6 TPU-v3, minutes from run_start to run_stop")
    say(table(bm_rows))
  label = next(iter(rows)) if len(rows) == 1 else "all"
  out = os.path.join(output_dir, f"scale_{label}.json")
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  with open(out, "w") as f:
    json.dump({"benchmarks": rows, "within": WITHIN}, f, indent=1, default=float)
  png = plot_path or os.path.join(output_dir, f"scale_{label}.png")
  plot(rows, png)
  say(f"wrote {out} and {png}")
  return rows


def _compile_only_analyze(topology_name: str):
  from mesh import topology
  # Before jax starts: the host backend stays on CPU; naming a v3 slice keeps libtpu quiet.
  topology.prepare_host(topology.parse(topology_name))
  from benchmarks.pod import compile_only
  return compile_only.analyze


# --- output -------------------------------------------------------------------------------------

HEAD = ("chips", "topology", "batch", "epochs", "step ms", "eval step ms", "predicted min",
        "published min", "ratio", "within 30%")


def _cells(row: dict) -> tuple[str, ...]:
  """A row's table cells: its point (as a dict) and prediction."""
  point, p = row["point"], row["prediction"]
  fit = "" if p["fits"] is not False else " (no fit)"
  return (str(point["chips"]), point["topology"], str(point["global_batch_size"]),
          f"{point['converged_epochs']:g}", f"{p['step_s'] * 1e3:.2f}",
          f"{p['eval_step_s'] * 1e3:.2f}", f"{p['minutes']:.2f}{fit}",
          f"{point['published_minutes']:.2f}", f"{p['ratio']:.2f}",
          "yes" if p["within_30pct"] else "no")


def line(row: dict) -> str:
  return "  " + ", ".join(f"{h} {c}" for h, c in zip(HEAD, _cells(row)))


def table(rows: list[dict]) -> str:
  cells = [HEAD] + [_cells(r) for r in rows]
  widths = [max(len(c[i]) for c in cells) for i in range(len(HEAD))]

  def fmt(c):
    return "| " + " | ".join(x.rjust(w) for x, w in zip(c, widths)) + " |"
  return "\n".join([fmt(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
                   + [fmt(c) for c in cells[1:]])


def plot(rows: dict[str, list[dict]], path: str) -> None:
  """Log-log minutes against chips, published and predicted, one panel per benchmark."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import FuncFormatter
  fig, axes = plt.subplots(1, len(rows), figsize=(5.2 * len(rows), 4.2), squeeze=False)
  for ax, (name, bm_rows) in zip(axes[0], rows.items()):
    chips = [r["point"]["chips"] for r in bm_rows]
    ax.plot(chips, [r["point"]["published_minutes"] for r in bm_rows], "o-",
            label="published (Google, MLPerf v0.6)")
    ax.plot(chips, [r["prediction"]["minutes"] for r in bm_rows], "s--",
            label="predicted (compiled step x Google's steps)")
    for c, r in zip(chips, bm_rows):
      ax.annotate(f"{r['prediction']['ratio']:.2f}x", (c, r["prediction"]["minutes"]),
                  textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    values = [r[k]["minutes" if k == "prediction" else "published_minutes"]
              for r in bm_rows for k in ("point", "prediction")]
    few = max(values) / min(values) < 10        # under a decade: label every minor tick
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(
        lambda v, _, few=few: f"{v:g}" if few or f"{v:g}"[0] in "25" else ""))
    ax.set_xticks(chips, [str(c) for c in chips])
    ax.set_xlabel("TPU-v3 chips")
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


def check_outputs(fv: flags.FlagValues) -> None:
  """Where the results go can be written, checked before minutes of compiling."""
  config_lib.check_writable("--output_dir", fv.output_dir)
  if fv.plot:
    config_lib.check_writable("--plot", fv.plot, kind="file")
  if fv.cache_dir:
    config_lib.check_writable("--cache_dir", fv.cache_dir)


def main(argv: list[str]) -> int:
  fv = flags.FlagValues()           # a fresh set per call
  flags_lib.define(fv, FLAGS)
  rest = argv[1:]
  if any(a in ("--help", "-h", "--helpfull") for a in rest):
    print(__doc__.split("\n\n")[1] + "\n\nflags:\n" + fv.get_help(include_special_flags=False))
    return 0
  if not rest or rest[0].startswith("-"):
    raise UserError(f"name a benchmark: run.sh scale <benchmark> [--chips=16,64] with "
                    f"benchmark one of {', '.join(POINTS)} or all")
  try:
    extra = fv([argv[0]] + rest[1:])[1:]
  except flags.Error as e:
    raise _parse_error(e, fv) from None
  if extra:
    raise UserError(f"unexpected argument '{extra[0]}'; flags are written --name=value")
  points = select(rest[0], parse_chips(fv.chips))
  check_outputs(fv)
  run(points, fv.output_dir, fv.plot, fv.cache_dir, fv.refresh, fv.with_eval,
      overlap=fv.overlap)
  return 0

if __name__ == "__main__":
  from benchmarks.main import run_main
  run_main(main)
