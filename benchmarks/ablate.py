"""Ablation: each optimization on and off, compiled and timed side by side in one process.

  ./run.sh ablate resnet [--config=cpu] [--ablate_steps=10] [--ablate_rounds=3] [--flag=value]

`--ablate_steps=0` only compiles: collectives and memory of models too big to time here (SSD at
300x300, ResNet-34 backbone).

  ./run.sh ablate resnet --config=tpu-v3-2048 --topology=v3:32x32

At pod scale (`--topology`, compile-only, `benchmarks.compile_only`): the preset as configured,
then the preset without each of its optimizations in turn, on the same slice, mesh and batch;
per variant the memory per device, collective bytes per device, the modelled train and eval
step times (`mesh.steptime`) and the minutes to train they predict, with the ratio of each
variant's step time to the preset's. Without `spatial_partitioning` the spatial mesh axis stays
in the mesh, idle: each replica's 4 cores then compute the same image rows, which is what the
same cores do without the optimization.

For every variant (mesh, layout, optimizations; the benchmark config module's ABLATIONS) it
compiles the benchmark's step and reports
collective bytes by kind, memory per device, optimizer-state bytes per device, the median step
time and the median time of one full evaluation. Variants are timed in interleaved rounds, so
machine noise hits them alike; ratios are against the first row on the same mesh (its
baseline).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time

from absl import flags

from benchmarks import config as config_lib
from benchmarks import main as cli
from mesh.errors import UserError

FLAGS = flags.FLAGS
flags.DEFINE_integer("ablate_steps", 10, "Timed training steps per variant per round "
                     "(0: compile only, no timing).")
flags.DEFINE_integer("ablate_rounds", 3, "Interleaved timing rounds.")
flags.DEFINE_string("ablate_json", None, "Also write the results to this JSON file.")
ABLATE_FLAGS = ["ablate_steps", "ablate_rounds", "ablate_json"]

def ablate(cfg, build, variants, steps: int, rounds: int) -> list[dict]:
  import jax  # pylint: disable=import-outside-toplevel

  from benchmarks import step as step_lib  # pylint: disable=import-outside-toplevel
  from benchmarks import train  # pylint: disable=import-outside-toplevel
  from mesh import cost as cost_lib  # pylint: disable=import-outside-toplevel

  runs = []
  for label, mesh, layout, opts in variants:
    c = dataclasses.replace(cfg, mesh=mesh, layout=layout, optimizations=opts)
    sharder, plan = train.build_sharder(c)
    task = build(c, replicas=sharder.batch_size_divisor("batch") * plan.accumulation_steps)
    batches = [b for _, b in zip(range(max(steps, 1)), task.data.train(0))]
    program, state = step_lib.compile_program(task, sharder, c.seed, batches[0],
                                              next(iter(task.data.eval())), 1, plan)
    batches = [step_lib.global_batch(b, program.batch_shardings) for b in batches]
    for b in batches[:2] if steps else []:   # warm up
      state, m = program.train(state, b)
      jax.block_until_ready(m)
    runs.append({"label": label, "mesh": mesh, "layout": str(plan.layout), "optimizations": opts,
                 "program": program, "state": state, "batches": batches, "task": task,
                 "step_s": [], "eval_s": []})
    print(f"compiled {label} ({mesh}) in {program.compile_s:.1f}s", flush=True)
  for r in range(rounds if steps else 0):
    for run in runs:
      for b in run["batches"]:
        t = time.perf_counter()
        run["state"], m = run["program"].train(run["state"], b)
        jax.block_until_ready(m)
        run["step_s"].append(time.perf_counter() - t)
      t = time.perf_counter()
      step_lib.evaluate(run["program"], run["state"], run["task"].data.eval())
      run["eval_s"].append(time.perf_counter() - t)
    print(f"round {r + 1}/{rounds} done", flush=True)

  rows, base = [], {}
  for run in runs:
    cost = run["program"].step_cost
    mem = cost["memory_per_device"]
    row = {
        "label": run["label"], "mesh": run["mesh"], "layout": run["layout"],
        "optimizations": run["optimizations"],
        "collective_bytes": {k: v["bytes"] for k, v in cost["collectives"].items()},
        "collective_counts": {k: v["count"] for k, v in cost["collectives"].items()},
        "argument_bytes": mem.get("argument_bytes"), "temp_bytes": mem.get("temp_bytes"),
        "opt_state_bytes": cost_lib.bytes_per_device(run["state"]["opt_state"]),
        "step_ms": 1e3 * statistics.median(run["step_s"]) if run["step_s"] else None,
        "eval_ms": 1e3 * statistics.median(run["eval_s"]) if run["eval_s"] else None,
    }
    b = base.setdefault(run["mesh"], row)
    row["step_ratio"] = row["step_ms"] / b["step_ms"] if steps else None
    row["eval_ratio"] = row["eval_ms"] / b["eval_ms"] if steps else None
    rows.append(row)
  return rows


def pod_variants(cfg) -> list[tuple[str, str]]:
  """(label, optimizations): the preset's, then the preset's without each one in turn."""
  import optimizations  # pylint: disable=import-outside-toplevel
  names = [o for o in cfg.optimizations.split(",") if o and o != "none"]
  out = [("preset: " + (cfg.optimizations or "none"), cfg.optimizations)]
  for o in names:
    rest = ",".join(x for x in names if x != o) or "none"
    optimizations.parse(rest)
    out.append((f"- {o.split(':')[0]}", rest))
  return out


def pod_ablate(name: str, cfg, topology_name: str) -> list[dict]:
  from benchmarks import compile_only  # pylint: disable=import-outside-toplevel
  rows = []
  for label, opts in pod_variants(cfg):
    s = compile_only.analyze(name, dataclasses.replace(cfg, optimizations=opts), topology_name,
                             cache_dir=FLAGS.compile_cache or None)
    print(f"compiled {label} in {s['compile_s']:.0f}s", flush=True)
    row = {"label": label, "optimizations": opts, "fits": s["fits"], "refused": s["refused"]}
    for step in ("train", "eval"):
      st = s[step]
      row[step] = None if st is None else {
          "memory_bytes": st["memory_per_device"].get("total_bytes"),
          "collective_bytes": {k: v["bytes"] for k, v in st["collectives"].items()},
          "collective_counts": {k: v["count"] for k, v in st["collectives"].items()},
          "model_ms": 1e3 * st["model"]["step_s"],
          "collective_ms": 1e3 * st["model"]["collective_s"],
          "xla_ms": None if st["optimal_seconds"] is None else 1e3 * st["optimal_seconds"]}
    row["minutes"] = s["prediction"]["minutes"] if s["prediction"] else None
    rows.append(row)
  base = rows[0]
  for r in rows:
    for step in ("train", "eval"):
      if r[step] and base[step]:
        r[step]["ratio"] = r[step]["model_ms"] / base[step]["model_ms"]
  return rows


def pod_table(rows: list[dict]) -> str:
  mib = lambda n: f"{n / 2**20:,.0f}"
  head = ("| variant | train memory GiB/dev | all-reduce MiB | reduce-scatter MiB | "
          "all-gather MiB | coll.-permute MiB | collectives ms | train step ms (vs preset) | "
          "eval step ms (vs preset) | minutes |")
  lines = [head, "|" + "---|" * 10]
  for r in rows:
    t, e = r["train"], r["eval"]
    if t is None:
      lines.append(f"| {r['label']} | does not fit: {r['refused']} |" + " |" * 8)
      continue
    c = t["collective_bytes"]
    ev = "-" if e is None else f"{e['model_ms']:.2f} ({e.get('ratio', 1):.2f}x)"
    lines.append(
        f"| {r['label']} | {t['memory_bytes'] / 2**30:.2f} | {mib(c['all-reduce'])} | "
        f"{mib(c['reduce-scatter'])} | {mib(c['all-gather'])} | "
        f"{mib(c['collective-permute'])} | {t['collective_ms']:.2f} | "
        f"{t['model_ms']:.2f} ({t.get('ratio', 1):.2f}x) | {ev} | "
        f"{'-' if r['minutes'] is None else format(r['minutes'], '.2f')} |")
  return "\n".join(lines)


def table(rows: list[dict]) -> str:
  kb = lambda n: f"{n / 1024:,.0f}"
  ms = lambda t, ratio, fmt: "-" if t is None else f"{t:{fmt}} ({ratio:.2f})"
  head = ("| variant | mesh | all-reduce KiB | reduce-scatter KiB | all-gather KiB | "
          "coll.-permute KiB | args KiB/dev | opt state KiB/dev | temps KiB/dev | "
          "step ms (ratio) | eval ms (ratio) |")
  lines = [head, "|" + "---|" * 11]
  for r in rows:
    c = r["collective_bytes"]
    n = r["collective_counts"]
    lines.append(
        f"| {r['label']} | `{r['mesh']}` | {kb(c['all-reduce'])} ({n['all-reduce']}) | "
        f"{kb(c['reduce-scatter'])} ({n['reduce-scatter']}) | {kb(c['all-gather'])} "
        f"({n['all-gather']}) | {kb(c['collective-permute'])} ({n['collective-permute']}) | "
        f"{kb(r['argument_bytes'])} | {kb(r['opt_state_bytes'])} | {kb(r['temp_bytes'])} | "
        f"{ms(r['step_ms'], r['step_ratio'], '.1f')} | "
        f"{ms(r['eval_ms'], r['eval_ratio'], '.0f')} |")
  return "\n".join(lines)


def check_flags() -> None:
  """ablate's own flags, before anything is compiled: the JSON path can be written."""
  if FLAGS.ablate_steps < 0:
    raise UserError(f"--ablate_steps={FLAGS.ablate_steps}: timed steps per variant, >= 0 (0: "
                    f"compile only)")
  if FLAGS.ablate_rounds < 1:
    raise UserError(f"--ablate_rounds={FLAGS.ablate_rounds}: at least 1 timing round")
  if FLAGS.ablate_json:
    config_lib.check_writable("--ablate_json", FLAGS.ablate_json, kind="file")


def main(argv: list[str]) -> int:
  name, entry, cfg = cli.setup(argv, verb="ablate <benchmark>", run_flags=ABLATE_FLAGS,
                               compiles_only_with_topology=True)
  check_flags()
  if FLAGS.topology:
    rows = pod_ablate(name, cfg, FLAGS.topology)
    print(pod_table(rows))
  else:
    rows = ablate(cfg, entry.build(), entry.config().ABLATIONS, FLAGS.ablate_steps,
                  FLAGS.ablate_rounds)
    print(table(rows))
  if FLAGS.ablate_json:
    with open(FLAGS.ablate_json, "w") as f:
      json.dump(rows, f, indent=2)
  return 0


if __name__ == "__main__":
  cli.run_main(main)
