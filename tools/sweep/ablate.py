"""Ablation: each optimization on and off, compiled and timed side by side in one process.

  ./run.sh ablate resnet [--config=cpu] [--ablate_steps=10] [--ablate_rounds=3] [--flag=value]

The variants are the benchmark config module's ABLATIONS (label, mesh, layout, optimizations);
the first row of each mesh is the baseline of that mesh's rows. `./run.sh sweep` measures them
(`tools.sweep.measure`, `tools.sweep.tables`): per variant collective bytes by kind,
memory per device, optimizer-state bytes per device, the median step time and the median time
of one full evaluation; each variant takes turns with its baseline for `--ablate_rounds`
rounds, so machine noise hits both alike, and its ratios are the medians of the per-round
ratios. `--ablate_steps=0` only compiles: collectives and memory of models too big to time
here (SSD at 300x300, ResNet-34 backbone).

  ./run.sh ablate resnet --config=tpu-v3-2048 --topology=v3:32x32

At pod scale (`--topology`, compile-only, `harness.compile_only`): the preset as configured,
then the preset without each of its optimizations in turn, on the same slice, mesh and batch;
per variant the memory per device, collective bytes per device, the modelled train and eval
step times (`stepmodel.steptime`) and the minutes to train they predict, with the ratio of each
variant's step time to the preset's. Without `spatial_partitioning` the spatial mesh axis stays
in the mesh, idle: each replica's 4 cores then compute the same image rows, which is what the
same cores do without the optimization.

`./run.sh sweep` asks the same question of any grid of optimizations and layouts, writes CSV,
Markdown and plots, and resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import json

import optimizations
from benchmarks import config as config_lib
from harness import cli
from harness.options import flag
from runtime.errors import UserError
from tools.sweep import measure, tables
from tools.sweep.grid import Variant


@dataclasses.dataclass(frozen=True)
class AblateOptions:
  """ablate's own flags (`harness.cli.setup`)."""
  ablate_steps: int = flag(10, "Timed training steps per variant per round (0: compile only, "
                           "no timing).")
  ablate_rounds: int = flag(3, "Timing rounds, each variant taking turns with its baseline.")
  ablate_json: str | None = flag(None, "Also write the results to this JSON file.")

  def check(self, o, given) -> None:
    """ablate's own flags, before anything is compiled: the JSON path can be written."""
    del o, given
    if self.ablate_steps < 0:
      raise UserError(f"--ablate_steps={self.ablate_steps}: timed steps per variant, >= 0 (0: "
                      f"compile only)")
    if self.ablate_rounds < 1:
      raise UserError(f"--ablate_rounds={self.ablate_rounds}: at least 1 timing round")
    if self.ablate_json:
      config_lib.check_writable("--ablate_json", self.ablate_json, kind="file")


def variants(ablations) -> list[Variant]:
  """ABLATIONS rows as variants: the first row of each mesh is that mesh's baseline."""
  out, first = [], {}
  for i, (label, mesh, layout, opts) in enumerate(ablations):
    key = f"row{i}"
    out.append(Variant(key=key, label=label, group=mesh, mesh=mesh, layout=layout,
                       optimizations=opts, baseline=first.setdefault(mesh, key)))
  return out


def pod_variants(cfg) -> list[Variant]:
  """The preset's optimizations, then the preset's without each one in turn."""
  names = [o for o in cfg.optimizations.split(",") if o and o != "none"]
  sets = [("preset: " + (cfg.optimizations or "none"), cfg.optimizations)]
  for o in names:
    rest = ",".join(x for x in names if x != o) or "none"
    optimizations.parse(rest)
    sets.append((f"- {o.split(':')[0]}", rest))
  return [Variant(key=f"row{i}", label=label, group="", mesh=cfg.mesh, layout=cfg.layout,
                  optimizations=opts, baseline="row0") for i, (label, opts) in enumerate(sets)]


def main(argv: list[str]) -> int:
  run = cli.setup(argv, verb="ablate <benchmark>", tool=AblateOptions,
                  compiles_only_with_topology=True, one_process=True)
  name, o, t = run.name, run.options, run.tool
  rows: list[dict] = []
  if o.topology:
    vs = pod_variants(run.cfg)
    runs = measure.runs_of(run, vs)
    for v in vs:
      rows.append(measure.pod_row(runs[v.key], v, o.compile_cache or None))
  else:
    vs = variants(run.entry.config().ABLATIONS)
    measure.measure_local(measure.runs_of(run, vs), vs, t.ablate_steps, t.ablate_rounds,
                          {v.key for v in vs}, rows.append)
    order = {v.key: i for i, v in enumerate(vs)}
    rows.sort(key=lambda r: order[r["variant"]])
  if not any(r.get("status") == "done" for r in rows):
    reasons = sorted({r.get("reason") or "?" for r in rows})
    where = o.topology or "this machine's devices"
    raise UserError(f"ablate {name}: none of its {len(rows)} variants could run on {where} "
                    f"({'; '.join(reasons)[:400]}); choose a mesh or slice they fit "
                    f"(--num_cpu_devices, --mesh, --topology)")
  print(tables.pod_table(rows, "preset") if o.topology else tables.local_table(rows))
  if t.ablate_json:
    with open(t.ablate_json, "w") as f:
      json.dump(rows, f, indent=2)
  return 0


if __name__ == "__main__":
  cli.run_main(main)
