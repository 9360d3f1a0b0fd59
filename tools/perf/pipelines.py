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
import os
import resource
import shutil
import sys
import time
from typing import Any, Callable

import absl.logging
import jax

from benchmarks import registry
from benchmarks.common import grammar
from benchmarks.lm import data as lm_data
from benchmarks.resnet import data as resnet_data
from benchmarks.ssd import data as ssd_data
from benchmarks.ssd import shapes
from benchmarks.ssd import suite as ssd_suite
from benchmarks.ssd.config import PRESETS
from benchmarks.transformer import data as transformer_data
from harness import build
from harness import run as runs
from harness import step as step_lib
from runtime import backend, scratch

NAMES = ("resnet", "ssd", "transformer", "lm")
GOAL = 3.0
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

  @staticmethod
  def tiny(**kw) -> "Settings":
    base = dict(batches=1, warmup=1, steps=0, imagenet_sides=(48, 72), coco_size=(160, 128),
                real_sizes=False, batch=8, pairs=600)
    base.update(kw)
    return Settings(**base)


# --- CPU time of this process and its workers ---------------------------------------------------

def _cpu_now() -> float:
  """CPU seconds so far of this process (all threads), its live descendants (worker processes)
  and its reaped children."""
  import psutil
  total = time.process_time()
  for p in psutil.Process().children(recursive=True):
    try:
      t = p.cpu_times()
      total += t.user + t.system
    except psutil.Error:          # ended meanwhile: counted below once reaped
      pass
  r = resource.getrusage(resource.RUSAGE_CHILDREN)
  return total + r.ru_utime + r.ru_stime


def _examples(batch: dict) -> int:
  return len(next(iter(batch.values())))


def time_pipeline(make: Callable[[], Any], warmup: int, batches: int | None
                  ) -> dict[str, float]:
  """One run of `make()`'s training iterator, from calling `train(0)` to its
  `warmup + batches`-th batch (`batches` None: the whole epoch): wall and CPU seconds, and the
  rates they give. Start-up (spawning worker processes, first reads) is inside: the rates are
  conservative, the more so the shorter the run; `start_s` is the time to the first batch.
  (A warmup on the same iterator and then a timed stretch would count as free the batches its
  prefetch made during the warmup: grain's 16 threads make 16 batches at once. The difference
  of two runs of different lengths fails for the same reason.) `warmup` only sets the length."""
  data = make()
  n_batches = data.steps_per_epoch if batches is None else warmup + batches
  if data.steps_per_epoch < n_batches:
    raise ValueError(f"{data.name}: {data.steps_per_epoch} batches per epoch, fewer than "
                     f"{n_batches}")
  c0, w0 = _cpu_now(), time.perf_counter()
  gen = data.train(0)
  try:
    n = _examples(next(gen))
    start = time.perf_counter() - w0
    n += sum(_examples(next(gen)) for _ in range(n_batches - 1))
    wall, cpu = time.perf_counter() - w0, _cpu_now() - c0
  finally:
    gen.close()             # stops its worker processes
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
  if name == "resnet":
    return resnet_data.write_imagenet(folder, n, 4, sizes=s.imagenet_sides, photo=True)
  if name == "ssd":
    return shapes.ensure(folder, n, 2, size=s.coco_size)
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
  root = scratch.make("meshperf-input-", tmp_dir)
  t0 = time.perf_counter()
  try:
    for name in names:
      say(f"  {name}: writing its dataset")
      batch = s.batch or _config(name, "", s).global_batch_size
      w0 = time.perf_counter()
      data_dir = _write(name, root, batch * (s.warmup + s.batches), s)
      cfg = _config(name, data_dir, s)
      out = {"format": "", "written_s": time.perf_counter() - w0, "pipelines": [],
             "step": None, "ratio": None}
      for label, default, vcfg in _variants(name, cfg, s):
        side = ("{}-{}".format(*s.imagenet_sides) if name == "resnet"
                else "{}x{}".format(*s.coco_size))
        fmt = FORMATS[name].format(side=side, size=label.split()[0])
        if default:
          out["format"] = fmt
        for w in (workers if name in ("resnet", "ssd") else (0,)):
          wcfg = dataclasses.replace(vcfg, data_workers=w)
          # Text batches take about a millisecond: the whole epoch is timed.
          p = time_pipeline(lambda c=wcfg: _make(name, c), s.warmup,
                            s.batches if name in ("resnet", "ssd") else None)
          p.update(variant=label, cpu_default=default, workers=w, batch=vcfg.global_batch_size,
                   format=fmt)
          out["pipelines"].append(p)
          say(f"    {label}, {w} worker(s): {_num(p['examples_per_s'])} examples/s, "
              f"{_num(p['cpu_s_per_example'], 1e3, 2)} ms CPU per example, "
              f"{_num(p['cores_busy'], 1, 2)} cores busy, start-up {p['start_s']:.1f} s")
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
    shutil.rmtree(root, ignore_errors=True)
  result["env"]["load_average_end"] = _load()
  result["env"]["seconds"] = time.perf_counter() - t0
  return result


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
  a = p.parse_args(argv)
  try:
    workers = tuple(int(w) for w in a.workers.split(","))
  except ValueError:
    workers = (-1,)
  names = tuple(n for n in a.names.split(",") if n)
  problem = (f"--workers={a.workers}: counts >= 0" if min(workers) < 0 else
             f"--batches={a.batches}: at least 1" if a.batches < 1 else
             f"--steps={a.steps}: >= 0" if a.steps < 0 else
             f"--names={a.names}: choose from {', '.join(NAMES)}" if not names
             or set(names) - set(NAMES) else None)
  if problem:
    print(f"error: {problem}", file=sys.stderr)
    return 2
  backend.use_cpu_devices(a.num_cpu_devices)
  s = (Settings.tiny(batches=a.batches, steps=a.steps) if a.tiny
       else Settings(batches=a.batches, steps=a.steps))
  result = measure(print, workers, s, names)
  print("\n".join(markdown(result)))
  for r in rows(result):
    print(f"{r['comparison']}: {r['what']}: {r['value']} (goal {r['goal']}, "
          f"{'met' if r['met'] else 'not met'}); {r['detail']}")
  print(f"{result['env']['seconds']:.0f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
