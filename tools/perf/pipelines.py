"""Each benchmark's input pipeline against its training step (`./run.sh perf`, comparison
`input_headroom`).

For each benchmark a small dataset is written in its real format in a temporary folder:

  resnet       ImageNet as tensorflow-datasets prepares it (ArrayRecord of JPEGs, the real
               `imagenet2012` builder), photo-like JPEGs of 300-450 px a side (about 375 x 375,
               ImageNet's average is about 400 x 350); decoded and inception-cropped to 224 px
               (MLPerf's size) and to the CPU default's size, read with grain
  ssd          COCO 2017 layout (annotation json, JPEG folders) of 640 x 480 images (COCO's
               size); decoded, IoU-cropped, flipped, resized to 300 px (MLPerf's size) and to the
               CPU default's size, boxes matched to the default boxes
  transformer  WMT14 en-de as tensorflow-datasets prepares it (ArrayRecord), tokenized with
               sentencepiece, rows at the CPU default's length
  lm           lm1b as tensorflow-datasets prepares it (ArrayRecord), tokenized, packed rows at
               the CPU default's length

and the benchmark's own `Data.train(epoch)` iterator (the code the training loop runs, made by
the benchmark's data `make` from a Config: the CPU default's, the dataset replaced) is timed:
one run from the iterator's start to its `warmup + batches`-th batch, start-up included (so
the rates are conservative: see `time_pipeline`). Reported: examples/s, and CPU seconds per
example counting every process that works for the pipeline (this one, all its threads, and its
worker processes) -> examples/s per core, for sizing a GPU host or a TPU VM. With
`--data_workers=N` (resnet: grain's `mp_prefetch`; ssd: a process pool) N processes make the
examples; the text pipelines assemble rows of in-memory token arrays in this process and have no
workers.

The consumption rate: the CPU default's compiled train step (built as `./run.sh <benchmark>`
builds it, the dataset replaced by the one above: the same shapes, so the same program), timed
over a few steps: global batch / seconds per step. Ratio = pipeline examples/s at the CPU
default's settings (its image size, sequence length, batch, `data_workers` 0) / step
examples/s; the goal is a ratio >= 3 for every benchmark.

`python -m tools.perf.pipelines` runs it and prints the table; `measure`, `rows` and
`markdown` are for `./run.sh perf`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from typing import Any, Callable

import absl.logging
import jax
import numpy as np

from benchmarks import registry
from benchmarks.common import grammar
from benchmarks.data import open_tfds
from benchmarks.lm import data as lm_data
from benchmarks.resnet import data as resnet_data
from benchmarks.ssd import boxes as box_lib
from benchmarks.ssd import data as ssd_data
from benchmarks.ssd import shapes
from benchmarks.ssd import suite as ssd_suite
from benchmarks.ssd.config import PRESETS
from benchmarks.transformer import data as transformer_data
from harness import build
from harness import run as runs
from harness import step as step_lib
from runtime import backend, host, scratch
from runtime.errors import UserError
from tools.perf import dali

NAMES = ("resnet", "ssd", "transformer", "lm")
IMAGES = ("resnet", "ssd")            # the pipelines with worker processes, DALI and sizing
GOAL = 3.0
# Examples/s per GPU a host's pipeline must feed, to size it (`per_core`).
GPU_RATES = {
    "resnet": (7767, "NVIDIA's MLPerf v4.0 ResNet-50 on 8 x H200, end to end: "
                     "mlcommons/training_results_v4.0 NVIDIA h200_ngc24.04_mxnet"),
    "ssd": (3169, "meshperf's SSD step measured on one H200, 2026-12-04 (docs/gpu.md)"),
}
FORMATS = {
    "resnet": "tfds imagenet2012 ArrayRecord, JPEG {side} px -> inception crop {size} px",
    "ssd": "COCO 2017 layout, JPEG {side} -> IoU crop, flip, {size} px, box matching",
    "transformer": "tfds wmt14 de-en ArrayRecord, sentencepiece, rows of {size} tokens",
    "lm": "tfds lm1b ArrayRecord, sentencepiece, packed rows of {size} tokens",
}


@dataclasses.dataclass(frozen=True)
class Settings:
  """How much to write and time. `tiny`: seconds, for tests (small images, small batches)."""
  batches: int = 5               # with warmup: batches per image pipeline (text: the epoch)
  warmup: int = 1                # the start-up's batch (timed too)
  steps: int = 5                 # timed train steps (0: no step compiled, no ratio)
  imagenet_sides: tuple[int, int] = (300, 450)
  coco_size: tuple[int, int] = (640, 480)
  real_sizes: bool = True        # also at MLPerf's image sizes (224 px ImageNet, 300 px COCO)
  batch: int = 0                 # 0: the CPU default's global batch
  pairs: int = 3000              # WMT14 pairs / lm1b lines written (tokenizer training too)
  data_dir: str = ""             # a prepared dataset to read instead of writing one
  evaluation: bool = True        # image benchmarks: also the evaluation pipeline (0 workers)
  dali: bool = True              # image benchmarks: also DALI's CPU pipeline, when installed

  @staticmethod
  def tiny(**kw) -> "Settings":
    base = dict(batches=1, warmup=1, steps=0, imagenet_sides=(48, 72), coco_size=(160, 128),
                real_sizes=False, batch=8, pairs=600, evaluation=False, dali=False)
    base.update(kw)
    return Settings(**base)


# --- CPU time of this process and its workers ---------------------------------------------------

def _examples(batch: dict) -> int:
  """The real examples of a batch (an evaluation batch's padding, `mask` 0, not counted)."""
  if "mask" in batch:
    return int(np.count_nonzero(batch["mask"]))
  return len(next(iter(batch.values())))


def time_pipeline(make: Callable[[], Any], warmup: int, batches: int | None,
                  split: str = "train") -> dict[str, float]:
  """One run of `make()`'s training iterator, from calling `train(0)` to its
  `warmup + batches`-th batch (`batches` None: the whole epoch): wall and CPU seconds, and the
  rates they give. Start-up (spawning worker processes, first reads) is inside: the rates are
  conservative, the more so the shorter the run; `start_s` is the time to the first batch.
  (A warmup on the same iterator and then a timed stretch would count as free the batches its
  prefetch made during the warmup: grain's 16 threads make 16 batches at once. The difference
  of two runs of different lengths fails for the same reason.) `warmup` only sets the length.
  `split` "eval": the evaluation iterator instead, at most its `eval_steps` batches."""
  data = make()
  per_epoch = data.steps_per_epoch if split == "train" else data.eval_steps
  n_batches = per_epoch if batches is None else warmup + batches
  if split == "eval":
    n_batches = min(n_batches, per_epoch)
  if per_epoch < n_batches:
    raise UserError(f"{data.name}: {per_epoch} batches per epoch, fewer than the {n_batches} "
                    f"to time; lower --batches")
  c0, w0 = host.cpu_seconds(), time.perf_counter()
  gen = data.train(0) if split == "train" else iter(data.eval())
  try:
    n = _examples(next(gen))
    start = time.perf_counter() - w0
    n += sum(_examples(next(gen)) for _ in range(n_batches - 1))
    wall, cpu = time.perf_counter() - w0, host.cpu_seconds() - c0
  finally:
    if hasattr(gen, "close"):
      gen.close()           # stops its worker processes
  return {"examples": n, "batches": n_batches, "wall_s": wall, "cpu_s": cpu, "start_s": start,
          "examples_per_s": n / wall, "cpu_s_per_example": cpu / n,
          "examples_per_core_s": n / cpu if cpu > 0 else None, "cores_busy": cpu / wall}


# --- datasets in their real formats --------------------------------------------------------------

def _quiet_tfds() -> None:
  """tensorflow-datasets' progress bars off (they would fill the report)."""
  import tensorflow_datasets as tfds
  tfds.disable_progress_bar()
  absl.logging.set_verbosity(absl.logging.WARNING)


def _write(name: str, root: str, n: int, s: Settings) -> str:
  """Writes benchmark `name`'s dataset of n training examples under root; returns data_dir."""
  folder = os.path.join(root, name)
  n_eval = n if s.evaluation else 4
  if name == "resnet":
    return resnet_data.write_imagenet(folder, n, n_eval, sizes=s.imagenet_sides, photo=True)
  if name == "ssd":
    return shapes.ensure(folder, n, n_eval, size=s.coco_size)
  if name == "transformer":
    en, de = grammar.corpus(s.pairs + 50, 11)
    transformer_data.write_wmt14(folder, (en[:s.pairs], de[:s.pairs]),
                                 (en[s.pairs:], de[s.pairs:]))
    return folder
  lines = lm_data.grammar_lines(s.pairs + 50, 11, True)
  lm_data.write_lm1b(folder, lines[:s.pairs], lines[s.pairs:])
  return folder


def _config(name: str, data_dir: str, s: Settings, **over):
  """The CPU default's config reading the written dataset (and `over`)."""
  cfg = registry.BENCHMARKS[name].config().PRESETS["cpu"]
  dataset = {"resnet": "imagenet", "ssd": "coco", "transformer": "wmt14", "lm": "lm1b"}[name]
  kw = dict(dataset=dataset, data_dir=data_dir)
  if name == "resnet":
    kw["num_classes"] = 1000       # the written ImageNet's labels name its 1,000 classes
  if s.batch:
    kw.update(global_batch_size=s.batch, eval_batch_size=s.batch)
  if name in ("transformer", "lm"):
    kw["tokenizer"] = os.path.join(data_dir, "spm.model")   # trained once, in the temp folder
  kw.update(over)
  return dataclasses.replace(cfg, **kw)


def _make(name: str, cfg):
  """The benchmark's Data for cfg, made by its data module's `make` (as its suite makes it)."""
  if name == "resnet":
    return resnet_data.make(cfg)
  if name == "ssd":
    return ssd_data.make(cfg, ssd_suite.anchors(cfg))[0]
  if name == "transformer":
    return transformer_data.make(cfg)[0]
  return lm_data.make(cfg)[0]


def _variants(name: str, cfg, s: Settings) -> list[tuple[str, bool, Any]]:
  """(label, at the CPU default's settings, config) of each pipeline to time."""
  if name == "resnet":
    out = [(f"{cfg.image_size} px", True, cfg)]
    if s.real_sizes and cfg.image_size != 224:
      out.insert(0, ("224 px", False, dataclasses.replace(cfg, image_size=224)))
    return out
  if name == "ssd":
    out = [(f"{cfg.image_size} px", True, cfg)]
    if s.real_sizes and cfg.image_size != 300:
      pod = PRESETS["tpu-v3-2048"]
      real = dataclasses.replace(cfg, **{f: getattr(pod, f) for f in (
          "image_size", "extra_blocks", "anchor_steps", "anchor_scales", "aspect_ratios")})
      out.insert(0, (f"{real.image_size} px", False, real))
    return out
  return [(f"{cfg.max_sequence_length} tokens", True, cfg)]


# --- the step ------------------------------------------------------------------------------------

def time_step(name: str, cfg, steps: int, say) -> dict[str, float]:
  """The compiled train step of `cfg` (built as a run builds it, on all devices), one warmup
  step, then `steps` timed: ms per step and examples/s."""
  planned = build.plan(runs.make(registry.BENCHMARKS[name], cfg, process_index=0,
                                process_count=1))
  start = time.process_time()        # the CPU clock as the compilation starts
  built = build.compile_planned(planned, with_eval=False, init=False)
  program, state = built.program, built.init()
  local = built.examples[0]
  say(f"    step compiled in {program.compile_s:.1f} s "
      f"({time.process_time() - start:.1f} s CPU)")
  batch = step_lib.global_batch(local, program.batch_shardings)
  state, metrics = program.train(state, batch)
  jax.block_until_ready((state, metrics))
  w0 = time.perf_counter()
  for _ in range(steps):
    state, metrics = program.train(state, batch)
  jax.block_until_ready((state, metrics))
  per_step = (time.perf_counter() - w0) / steps
  return {"global_batch": cfg.global_batch_size, "devices": len(planned.run.devices),
          "steps": steps,
          "ms_per_step": per_step * 1e3, "examples_per_s": cfg.global_batch_size / per_step}


# --- the measurement -----------------------------------------------------------------------------

def _load() -> list[float] | None:
  return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def measure(say: Callable[[str], None] = print, workers: tuple[int, ...] = (0, 1, 2),
            settings: Settings | None = None, names: tuple[str, ...] = NAMES,
            tmp_dir: str | None = None) -> dict[str, Any]:
  """`input_headroom`: each benchmark's pipeline (every variant at each worker count; the text
  pipelines have none, so only 0) and, with settings.steps, the CPU default's step. Writes the
  datasets under a temporary folder (removed after). Returns a dict for `rows` and `markdown`."""
  s = settings or Settings()
  result: dict[str, Any] = {
      "settings": dataclasses.asdict(s), "workers": list(workers),
      "env": {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu_count": os.cpu_count(),
              "load_average": _load()},
      "benchmarks": {}}
  _quiet_tfds()
  root = None if s.data_dir else scratch.make("meshperf-input-", tmp_dir)
  t0 = time.perf_counter()
  try:
    for name in names:
      batch = s.batch or _config(name, "", s).global_batch_size
      w0 = time.perf_counter()
      if s.data_dir:
        say(f"  {name}: reading {s.data_dir}")
        data_dir = s.data_dir
      else:
        say(f"  {name}: writing its dataset")
        data_dir = _write(name, root, batch * (s.warmup + s.batches), s)
      cfg = _config(name, data_dir, s)
      out = {"format": "", "written_s": time.perf_counter() - w0, "pipelines": [],
             "step": None, "ratio": None}
      for i, (label, default, vcfg) in enumerate(_variants(name, cfg, s)):
        side = ("{}-{}".format(*s.imagenet_sides) if name == "resnet"
                else "{}x{}".format(*s.coco_size))
        fmt = FORMATS[name].format(side=side, size=label.split()[0])
        if s.data_dir:
          fmt = f"{s.data_dir} -> {fmt.split(' -> ', 1)[-1]}"
        if default:
          out["format"] = fmt
        for w in (workers if name in IMAGES else (0,)):
          wcfg = dataclasses.replace(vcfg, data_workers=w)
          # Text batches take about a millisecond: the whole epoch is timed.
          p = time_pipeline(lambda c=wcfg: _make(name, c), s.warmup,
                            s.batches if name in IMAGES else None)
          p.update(variant=label, cpu_default=default, workers=w, batch=vcfg.global_batch_size,
                   format=fmt)
          out["pipelines"].append(p)
          say(f"    {label}, {w} worker(s): {_num(p['examples_per_s'])} examples/s, "
              f"{_num(p['cpu_s_per_example'], 1e3, 2)} ms CPU per example, "
              f"{_num(p['cores_busy'], 1, 2)} cores busy, start-up {p['start_s']:.1f} s")
        if name in IMAGES and i == 0:      # the first variant: MLPerf's size where timed
          out["sized"] = _sized(name, label, vcfg, data_dir, s, say)
      if s.steps:
        out["step"] = time_step(name, cfg, s.steps, say)
        base = _base(out)
        if base["examples_per_s"]:
          out["ratio"] = base["examples_per_s"] / out["step"]["examples_per_s"]
        say(f"    step: {out['step']['ms_per_step']:.0f} ms for {cfg.global_batch_size} "
            f"examples = {out['step']['examples_per_s']:.0f} examples/s; pipeline / step = "
            f"{_num(out['ratio'], 1, 1)}")
      result["benchmarks"][name] = out
  finally:
    if root:
      shutil.rmtree(root, ignore_errors=True)
  result["env"]["load_average_end"] = _load()
  result["env"]["seconds"] = time.perf_counter() - t0
  return result


def _sized(name: str, label: str, cfg, data_dir: str, s: Settings, say) -> dict[str, Any]:
  """At the first variant's size (MLPerf's, with real_sizes): the training pipeline's rate per
  core (0 workers, timed above), the evaluation pipeline's and DALI's CPU pipeline's on the
  same records, each None where not timed (`dali_skipped` says why)."""
  out: dict[str, Any] = {"variant": label, "eval": None, "dali": None, "dali_skipped": None}
  if s.evaluation:
    out["eval"] = time_pipeline(lambda: _make(name, cfg), s.warmup, s.batches, "eval")
    say(f"    {label}, evaluation: {_num(out['eval']['examples_per_core_s'])} examples/s per "
        f"core")
  why = None if s.dali else "not asked (--no-dali)"
  why = why or dali.available()
  if why:
    out["dali_skipped"] = why
    return out
  if name == "resnet":
    source = open_tfds(data_dir, "imagenet2012", "train", "imagenet", "", ("image",))
    pipe = dali.resnet_pipeline(source, cfg.global_batch_size, cfg.image_size)
  else:
    anchors = box_lib.xywh_to_ltrb(ssd_suite.anchors(cfg))
    pipe = dali.ssd_pipeline(data_dir, cfg.global_batch_size, cfg.image_size, anchors)
  out["dali"] = dali.time_dali(pipe, s.warmup + s.batches, host.cpu_seconds)
  say(f"    {label}, DALI's CPU pipeline ({out['dali']['threads']} threads): "
      f"{_num(out['dali']['examples_per_core_s'])} examples/s per core")
  return out


def per_core(result: dict, gpus: int = 8) -> dict[str, Any]:
  """`pipelines.json`: for each image benchmark timed, training examples/s per core at the
  first variant's size (0 workers), evaluation's and DALI's beside it, and the cores a host of
  `gpus` GPUs needs at `GPU_RATES`' examples/s per GPU."""
  out: dict[str, Any] = {"env": result["env"], "settings": result["settings"], "gpus": gpus,
                         "benchmarks": {}}
  for name, b in result["benchmarks"].items():
    if "sized" not in b:
      continue
    sized = b["sized"]
    train = next(p for p in b["pipelines"]
                 if p["variant"] == sized["variant"] and p["workers"] == 0)
    rate = train["examples_per_core_s"]
    per_gpu, source = GPU_RATES[name]
    rate_of = lambda r: r["examples_per_core_s"] if r else None
    out["benchmarks"][name] = {
        "variant": sized["variant"], "format": train["format"],
        "examples_per_s_per_core": rate,
        "eval_examples_per_s_per_core": rate_of(sized["eval"]),
        "dali_examples_per_s_per_core": rate_of(sized["dali"]),
        "dali_skipped": sized["dali_skipped"],
        "examples_per_s_per_gpu": per_gpu, "gpu_rate_source": source,
        "cores_for_gpus": math.ceil(gpus * per_gpu / rate) if rate else None,
        "train": train, "eval": sized["eval"], "dali": sized["dali"]}
  return out


def per_core_lines(summary: dict) -> list[str]:
  lines = [f"Per core at MLPerf's sizes (0 workers; the cores a host of {summary['gpus']} GPUs "
           f"needs at the GPU rate named):", "",
           "| benchmark | training ex/s per core | evaluation | DALI's CPU pipeline | GPU rate "
           "| cores |", "|---|---|---|---|---|---|"]
  for name, b in summary["benchmarks"].items():
    dali_rate = (_num(b["dali_examples_per_s_per_core"])
                 if b["dali_examples_per_s_per_core"] else f"- ({b['dali_skipped']})")
    lines.append(f"| {name} {b['variant']} | {_num(b['examples_per_s_per_core'])} | "
                 f"{_num(b['eval_examples_per_s_per_core'])} | {dali_rate} | "
                 f"{b['examples_per_s_per_gpu']:,} ({b['gpu_rate_source']}) | "
                 f"{b['cores_for_gpus'] or '-'} |")
  return lines


def _base(out: dict) -> dict:
  """The pipeline at the CPU default's settings, as it runs (no worker processes)."""
  return next(p for p in out["pipelines"] if p["cpu_default"] and p["workers"] == 0)


def _num(x, scale: float = 1, digits: int = 0) -> str:
  return "-" if x is None else f"{x * scale:.{digits}f}"


# --- reports -------------------------------------------------------------------------------------

def _scaling(out: dict, default_only: bool = True) -> str:
  ps = [p for p in out["pipelines"] if p["cpu_default"] or not default_only]
  by: dict[str, list[str]] = {}
  for p in ps:
    by.setdefault(p["variant"], []).append(f"{p['workers']}: {_num(p['examples_per_s'])}")
  return "; ".join(f"{v} ex/s by workers {', '.join(x)}" for v, x in by.items())


def rows(result: dict) -> list[dict[str, Any]]:
  """The `input_headroom` rows (as `tools.perf.report.goals`'): one per benchmark."""
  out = []
  for name, b in result["benchmarks"].items():
    base = _base(b)
    detail = (f"{b['format']}: {_num(base['examples_per_s'])} ex/s, "
              f"{_num(base['examples_per_core_s'])} ex/s per core; {_scaling(b, False)}")
    if b["step"] is None:
      value, met = "step not measured", False
    elif b["ratio"] is None:
      value, met = "pipeline too fast to time (more batches)", False
    else:
      value, met = f"{b['ratio']:.1f}x", b["ratio"] >= GOAL
      st = b["step"]
      detail += (f"; step {st['examples_per_s']:.0f} ex/s ({st['ms_per_step']:.0f} ms for "
                 f"{st['global_batch']})")
    out.append({"comparison": "input_headroom",
                "what": f"{name} input pipeline / CPU default's step, examples/s",
                "value": value, "goal": f">= {GOAL:g}x", "met": met, "detail": detail})
  return out


def markdown(result: dict) -> list[str]:
  """The table, one line per pipeline timed."""
  env = result["env"]
  lines = [f"Input pipelines ({env['when']}, {env['cpu_count']} cores, load average "
           f"{env['load_average']} -> {env.get('load_average_end')}): "
           f"one run of {result['settings']['warmup'] + result['settings']['batches']} batches "
           f"per image pipeline (a whole epoch for text), start-up included (conservative: "
           f"spawning workers takes seconds); CPU time counts this process and its worker "
           f"processes; ratio: "
           f"pipeline ex/s at the CPU default's settings (0 workers) / the CPU default's step.",
           "",
           "| benchmark | format | pipeline ex/s | CPU s/example | ex/s per core | workers | "
           "step ex/s | ratio |",
           "|---|---|---|---|---|---|---|---|"]
  for name, b in result["benchmarks"].items():
    for p in b["pipelines"]:
      step = (f"{b['step']['examples_per_s']:.0f}" if b["step"] and p["cpu_default"]
              else "-")
      is_base = p["cpu_default"] and p["workers"] == 0 and b["ratio"] is not None
      ratio = f"{b['ratio']:.1f}" if is_base else "-"
      lines.append(f"| {name} | {p['format']} | {_num(p['examples_per_s'])} | "
                   f"{_num(p['cpu_s_per_example'], 1e3, 2)} ms | "
                   f"{_num(p['examples_per_core_s'])} | {p['workers']} | {step} | {ratio} |")
  return lines


def main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(prog="python -m tools.perf.pipelines",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("--workers", default="0,1,2", help="worker process counts, e.g. 0,1,2")
  p.add_argument("--batches", type=int, default=Settings.batches)
  p.add_argument("--steps", type=int, default=Settings.steps, help="0: no step, no ratio")
  p.add_argument("--names", default=",".join(NAMES))
  p.add_argument("--tiny", action="store_true", help="seconds: small images and batches")
  p.add_argument("--num_cpu_devices", type=int, default=8)
  p.add_argument("--data_dir", default="", help="time the pipeline on this prepared dataset "
                 "(resnet: the tfds folder holding imagenet2012/, from `./run.sh prepare "
                 "imagenet`; ssd: COCO 2017's folder) instead of written photo-like images; "
                 "one of --names=resnet or ssd")
  p.add_argument("--output_dir", default="", help="write pipelines.json here: each image "
                 "benchmark's examples_per_s_per_core, evaluation's and DALI's beside it")
  p.add_argument("--gpus", type=int, default=8, help="size a host of this many GPUs")
  p.add_argument("--dali", action=argparse.BooleanOptionalAction, default=True,
                 help="also DALI's CPU pipeline on the same records, when installed "
                 "(`./run.sh install dali`)")
  p.add_argument("--evaluation", action=argparse.BooleanOptionalAction, default=True,
                 help="also the evaluation pipeline")
  a = p.parse_args(argv)
  try:
    workers = tuple(int(w) for w in a.workers.split(","))
  except ValueError:
    workers = (-1,)
  names = tuple(n for n in a.names.split(",") if n)
  problem = (f"--workers={a.workers}: counts >= 0" if min(workers) < 0 else
             f"--batches={a.batches}: at least 1" if a.batches < 1 else
             f"--steps={a.steps}: >= 0" if a.steps < 0 else
             f"--gpus={a.gpus}: at least 1" if a.gpus < 1 else
             f"--names={a.names}: choose from {', '.join(NAMES)}" if not names
             or set(names) - set(NAMES) else
             f"--data_dir={a.data_dir} does not exist" if a.data_dir
             and not os.path.isdir(a.data_dir) else
             f"--data_dir reads one image benchmark's dataset: pass --names=resnet or "
             f"--names=ssd with it (not {a.names})" if a.data_dir
             and (len(names) != 1 or names[0] not in IMAGES) else None)
  if problem:
    print(f"error: {problem}", file=sys.stderr)
    return 2
  backend.use_cpu_devices(a.num_cpu_devices)
  kw = dict(batches=a.batches, steps=a.steps, data_dir=a.data_dir, dali=a.dali,
            evaluation=a.evaluation)
  s = Settings.tiny(**kw) if a.tiny else Settings(**kw)
  try:
    result = measure(print, workers, s, names)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print("\n".join(markdown(result)))
  for r in rows(result):
    print(f"{r['comparison']}: {r['what']}: {r['value']} (goal {r['goal']}, "
          f"{'met' if r['met'] else 'not met'}); {r['detail']}")
  summary = per_core(result, a.gpus)
  if summary["benchmarks"]:
    print("\n".join([""] + per_core_lines(summary)))
  if a.output_dir:
    os.makedirs(a.output_dir, exist_ok=True)
    path = os.path.join(a.output_dir, "pipelines.json")
    with open(path, "w") as f:
      json.dump(summary, f, indent=1)
    print(f"wrote {path}")
  print(f"{result['env']['seconds']:.0f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
