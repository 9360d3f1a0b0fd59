"""Points to predict, as data: `./run.sh scale --points=FILE`.

A points file is JSON: `{"about": "...", "fit_on": "...", "host_fit_on": "...", "points":
[point, ...]}` (`fit_on`, `host_fit_on` optional: how `./run.sh scale` fits the file's points by
default, as its `--fit_on` and `--host_fit_on` take them), each point a run to predict:

  name               unique, e.g. "resnet-16"
  benchmark          a registered benchmark (resnet, transformer, ssd, lm)
  preset             the benchmark's preset the point starts from, e.g. "tpu-v3-2048"
  topology           the TPU slice or GPU hosts, e.g. "v3:4x4", "h200:1" (`stepmodel.topology`)
  mesh, global_batch_size   optional: the config's fields (shorthand for overrides)
  overrides          optional: {config field: value} over the preset (lists for tuples)
  train_steps        training steps to predict (float: a mean over runs is fine)
  evaluations        evaluations in the run (default 0)
  eval_steps         optional: steps per evaluation (default: the compiled dataset's)
  host               optional: {"startup_s", "final_scoring_s"}: host time inside the
                     timed run that no device program shows (input caches filling after
                     run_start; scoring the last evaluation on the host), each a measured
                     figure with its source; and "input_hosts": how many hosts' input
                     pipelines feed the batch (`stepmodel.host`)
  published_minutes  optional: the result to compare the prediction with
  measured           optional: {"train_step_ms", "eval_s", ...} measured on the hardware
  notes, source, facts   optional: free text, where the figures come from, other facts

The modelled minutes are (startup_s + train_steps x step + evaluations x eval_steps x eval step
+ final_scoring_s) / 60 (`tools.pod.scale`). `DEFAULT` is Google's MLPerf v0.6 TPU-v3
submissions, derived from their logs (`from_google`, written by `python -m
tools.pod.google_v06 --repo=DIR --points=FILE`); `H200` the steps measured on one H200. A file
naming a benchmark, preset, topology or config field that does not exist, a mesh that does not
fit the slice, or a batch its mesh does not divide is refused in one line before anything
compiles.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from typing import Any

from benchmarks import config as config_lib
from benchmarks import registry
from harness import run as runs
from runtime import files
from runtime.errors import UserError
from stepmodel import topology

DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "points",
                       "google-v0.6-tpu-v3.json")
H200 = os.path.join(os.path.dirname(DEFAULT), "h200-2026-12-04.json")
HOST_TERMS = ("startup_s", "final_scoring_s")
# How many hosts' input pipelines feed the batch (each its share): `stepmodel.host`.
INPUT_HOSTS = "input_hosts"


@dataclasses.dataclass(frozen=True)
class Point:
  name: str
  benchmark: str
  preset: str
  topology: str
  overrides: dict[str, Any]
  train_steps: float
  evaluations: float = 0.0
  eval_steps: int | None = None
  host: dict[str, float] = dataclasses.field(default_factory=dict)
  published_minutes: float | None = None
  measured: dict[str, Any] = dataclasses.field(default_factory=dict)
  notes: str = ""
  source: tuple[str, ...] = ()
  facts: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def entry(self) -> registry.Entry:
    """The registered benchmark the point runs (`check` refuses an unknown one)."""
    return registry.BENCHMARKS[self.benchmark]

  @property
  def chips(self) -> int:
    return topology.parse(self.topology).num_chips

  @property
  def measured_step_ms(self) -> float | None:
    return self.measured.get("train_step_ms")

  @property
  def images_per_host(self) -> float | None:
    """The examples each host's input pipeline makes per step (None where the point does not
    say how many hosts feed it)."""
    hosts = self.host.get(INPUT_HOSTS)
    batch = self.overrides.get("global_batch_size")
    return batch / hosts if hosts and batch else None


_REQUIRED = ("name", "benchmark", "preset", "topology", "train_steps")
_KNOWN = {f.name for f in dataclasses.fields(Point)} | {"mesh", "global_batch_size"}


def _number(where: str, key: str, value: Any, integer: bool = False) -> Any:
  ok = isinstance(value, int) if integer else isinstance(value, (int, float))
  if isinstance(value, bool) or not ok or value < 0 or not math.isfinite(value):
    kind = "a non-negative integer" if integer else "a non-negative number"
    raise UserError(f"{where}: '{key}' is {value!r}, expected {kind}")
  return value


def parse_point(raw: Any, where: str) -> Point:
  """One point of a file's `points` list (`where` names it in errors)."""
  if not isinstance(raw, dict):
    raise UserError(f"{where}: a point is a JSON object, got {type(raw).__name__}")
  missing = [k for k in _REQUIRED if k not in raw]
  if missing:
    raise UserError(f"{where}: missing {', '.join(missing)} (a point needs "
                    f"{', '.join(_REQUIRED)})")
  unknown = sorted(set(raw) - _KNOWN)
  if unknown:
    raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; a point's keys are "
                    f"{', '.join(sorted(_KNOWN))}")
  for key, kind in (("name", str), ("benchmark", str), ("preset", str), ("topology", str),
                    ("mesh", str), ("notes", str), ("measured", dict), ("facts", dict),
                    ("source", list)):
    if key in raw and not isinstance(raw[key], kind):
      raise UserError(f"{where}: '{key}' is {raw[key]!r}, expected "
                      f"{ {str: 'a string', dict: 'a JSON object', list: 'a list'}[kind] }")
  if not all(isinstance(s, str) for s in raw.get("source", [])):
    raise UserError(f"{where}: 'source' is a list of strings (links)")
  where = f"{where} ({raw['name']})"
  overrides = raw.get("overrides", {})
  if not isinstance(overrides, dict):
    raise UserError(f"{where}: 'overrides' is a JSON object of config fields")
  overrides = dict(overrides)
  for key in ("mesh", "global_batch_size"):
    if key in raw:
      if key in overrides and overrides[key] != raw[key]:
        raise UserError(f"{where}: '{key}' is {raw[key]!r} and overrides.{key} is "
                        f"{overrides[key]!r}; give it once")
      overrides[key] = raw[key]
  host = raw.get("host", {})
  if not isinstance(host, dict) or set(host) - {*HOST_TERMS, INPUT_HOSTS}:
    raise UserError(f"{where}: 'host' holds only {', '.join(HOST_TERMS)} (seconds) and "
                    f"{INPUT_HOSTS} (a count)")
  for key, value in host.items():
    _number(where, f"host.{key}", value, integer=key == INPUT_HOSTS)
  if host.get(INPUT_HOSTS) == 0:
    raise UserError(f"{where}: 'host.{INPUT_HOSTS}' is 0; at least one host feeds a run")
  eval_steps = raw.get("eval_steps")
  return Point(
      name=str(raw["name"]), benchmark=str(raw["benchmark"]), preset=str(raw["preset"]),
      topology=str(raw["topology"]), overrides=overrides,
      train_steps=_number(where, "train_steps", raw["train_steps"]),
      evaluations=_number(where, "evaluations", raw.get("evaluations", 0)),
      eval_steps=None if eval_steps is None else _number(where, "eval_steps", eval_steps, True),
      host=dict(host),
      published_minutes=(None if raw.get("published_minutes") is None else
                         _number(where, "published_minutes", raw["published_minutes"])),
      measured=dict(raw.get("measured") or {}), notes=str(raw.get("notes", "")),
      source=tuple(raw.get("source", ())), facts=dict(raw.get("facts") or {}))


def load(path: str = DEFAULT) -> list[Point]:
  """The points of a file, each checked (`check`); a UserError names what is wrong."""
  files.check_regular(path, "--points=")
  try:
    with open(path, encoding="utf-8") as f:
      doc = json.load(f)
  except FileNotFoundError:
    raise UserError(f"--points={path}: no such file") from None
  except OSError as e:
    raise UserError(f"--points={path}: cannot read it ({e.strerror})") from None
  except json.JSONDecodeError as e:
    raise UserError(f"--points={path}: not JSON ({e.msg} at line {e.lineno} column "
                    f"{e.colno})") from None
  except UnicodeDecodeError as e:
    raise UserError(f"--points={path}: not UTF-8 text (byte {e.start} is 0x{e.object[e.start]:02x}"
                    f"); JSON files are UTF-8") from None
  raw = doc.get("points") if isinstance(doc, dict) else None
  if not isinstance(raw, list) or not raw:
    raise UserError(f"--points={path}: expected {{\"points\": [...]}} with at least one point")
  points = [parse_point(p, f"--points={path}, point {i + 1}") for i, p in enumerate(raw)]
  names = [p.name for p in points]
  twice = sorted({n for n in names if names.count(n) > 1})
  if twice:
    raise UserError(f"--points={path}: point name(s) {', '.join(twice)} given twice")
  for p in points:
    check(p, f"--points={path}, point {p.name}")
  return points


def file_fit_on(path: str, key: str = "fit_on") -> str | None:
  """A points file's own `fit_on` or `host_fit_on` (how `./run.sh scale` fits it by default),
  None without one; `load` has read the file."""
  with open(path, encoding="utf-8") as f:
    value = json.load(f).get(key)
  if value is not None and not isinstance(value, str):
    raise UserError(f"--points={path}: '{key}' is {value!r}, expected a string (point names, "
                    f"chip counts{' or each' if key == 'fit_on' else ''})")
  return value


def config(point: Point):
  """The point's config: its preset with its overrides (lists become tuples)."""
  entry = point.entry
  base = config_lib.preset(entry.config().PRESETS, point.preset, point.benchmark)
  values = {k: tuple(v) if isinstance(v, list) else v for k, v in point.overrides.items()}
  return config_lib.replace(base, values)


def check(point: Point, where: str) -> None:
  """What can be checked before compiling: the benchmark, preset, config fields and values,
  the topology, the mesh against the slice's devices and the batches against the mesh."""
  if point.benchmark not in registry.BENCHMARKS:
    raise UserError(f"{where}: unknown benchmark '{point.benchmark}'; choose one of "
                    f"{', '.join(registry.BENCHMARKS)}")
  try:
    cfg = config(point)
    config_lib.validate_common(cfg)
    point.entry.config().validate(cfg)
    topo = topology.parse(point.topology)
    strings = runs.parse(point.entry, cfg)
    mesh, layout = strings.mesh, strings.layout
  except UserError as e:
    raise UserError(f"{where}: {e}") from None
  try:
    mesh = mesh.resolve(topo.num_devices)
    layout.check_against(mesh)
  except UserError as e:
    raise UserError(f"{where}: on {point.topology} ({topo.describe()}): {e}") from None
  replicas = math.prod(mesh.axis_size(a) for a in layout.axes_for("batch"))
  for key in ("global_batch_size", "eval_batch_size"):
    size = getattr(cfg, key) or cfg.global_batch_size
    if size % replicas:
      raise UserError(f"{where}: {key} {size} is not divisible by the {replicas} ways its "
                      f"layout splits the batch over mesh {cfg.mesh} ({topo.num_devices} "
                      f"devices of {point.topology})")


# --- Google's MLPerf v0.6 submissions, from their logs ------------------------------------------

REPO = "https://github.com/mlcommons/training_results_v0.6/tree/master/"
PRESET = "tpu-v3-2048"


def _mesh_2d(topology: str) -> str:
  """x:<cores along the first chip dimension>,y:<chips along the second> (the presets' form:
  v3:32x32 -> x:64,y:32)."""
  a, b = (int(n) for n in topology.split(":")[1].split("x"))
  return f"x:{2 * a},y:{b}"


def _median(xs) -> float:
  return sorted(xs)[len(xs) // 2]


def _resnet(d: dict[str, Any]) -> dict[str, Any]:
  # run_and_time.sh: 128 images per core up to 256 cores, then 32768; --steps_per_eval = 4
  # epochs; the lr schedule spans --train_steps (schedule_epochs); model_bn_span as logged.
  h, f = d["hparams"], d["run_and_time"]
  batch = d["global_batch_size"]
  return {"mesh": _mesh_2d(d["topology"]), "global_batch_size": batch,
          "overrides": {"eval_batch_size": f.get("eval_batch_size", batch),
                        "max_epochs": _median(d["epochs_per_log"]), "eval_every": 4,
                        "bn_span": d["model_bn_span"],
                        "base_learning_rate": h["opt_base_learning_rate"],
                        "warmup_epochs": float(h["opt_learning_rate_warmup_epochs"]),
                        "weight_decay": h["lars_opt_weight_decay"],
                        "lars_epsilon": h["lars_epsilon"],
                        "schedule_epochs": round(f["train_steps"] * batch
                                                 / h["num_train_examples"], 2)},
          "notes": "evaluation every 4 epochs, in the training loop's device program"}


# COCO 2017 train: the images with annotations (benchmarks/ssd/data.py), meshperf's epoch.
_COCO_TRAIN = 117266


def _ssd(d: dict[str, Any]) -> dict[str, Any]:
  # Google counts SSD epochs of 120,000 images (ssd_main.py num_examples_per_epoch) and its lr
  # boundaries in those epochs (ssd_constants.py; 42.6/53.3 at batch 1024, 56/70 at 2048); the
  # points give meshperf's epochs of COCO's 117,266 images: steps / meshperf's steps per epoch.
  h, f = d["hparams"], d["run_and_time"]
  batch = d["global_batch_size"]
  spatial = math.prod(f.get("input_partition_dims") or [1])   # --input_partition_dims=1,4,1,1
  replicas = 2 * d["chips"] // spatial
  per_epoch = _COCO_TRAIN // batch
  google_epoch = 120000 / batch
  small = batch == 1024
  drops = (42.6, 53.3) if small else (56.0, 70.0)
  evals = [s for s in d["eval_at_steps"] if s <= d["train_steps"]]
  return {"mesh": f"data:{replicas}" + (f",spatial:{spatial}" if spatial > 1 else ""),
          "global_batch_size": batch,
          "overrides": {
              "optimizations": ("spatial_partitioning," if spatial > 1 else "")
                               + "distributed_eval",
              "eval_batch_size": f.get("eval_batch_size", batch), "bn_span": d["model_bn_span"],
              "base_learning_rate": h["opt_base_learning_rate"],
              "warmup_steps": h["opt_learning_rate_warmup_steps"], "warmup_factor": 0.0,
              "decay_epochs": [round(e * google_epoch / per_epoch) for e in drops],
              "max_epochs": round(d["train_steps"] / per_epoch),
              "eval_epochs": [round(s / per_epoch) for s in evals[:-1]]},
          # ssd_main.py: TPUEstimator with InputPipelineConfig.PER_HOST_V2, one input pipeline
          # per TPU host; a v3 host has 4 chips (8 cores).
          "input_hosts": d["chips"] // 4,
          "notes": "evaluations predict on the device inside the training program; COCO scoring "
                   "runs on host processes while training goes on, except the converged one's"}


def _transformer(d: dict[str, Any]) -> dict[str, Any]:
  # translate_ende_wmt32k_packed: rows packed to 256 tokens, logged global_batch_size counts
  # rows; decoding pads inputs to 97 tokens (trainer_lib.py, "hparams.max_length = 97") and
  # decodes input length + 50 (--decode_hparams extra_length=50): at most 147 steps, stopping
  # early once no live beam can beat a finished one (models/transformer.py, utils/beam_search.py).
  h, f = d["hparams"], d["run_and_time"]
  batch = d["global_batch_size"]
  decode = f["decode_hparams"]
  return {"mesh": _mesh_2d(d["topology"]), "global_batch_size": batch,
          "overrides": {"eval_batch_size": decode["batch_size"], "max_sequence_length": 256,
                        "max_epochs": _median(d["epochs_per_log"]), "eval_every": 1,
                        "base_learning_rate": h["opt_base_learning_rate"],
                        "warmup_steps": h["opt_learning_rate_warmup_steps"],
                        "adam_beta1": h["opt_adam_beta_1"], "adam_beta2": h["opt_adam_beta_2"],
                        "adam_epsilon": h["opt_adam_epsilon"], "beam_size": decode["beam_size"],
                        "max_eval_length": 97, "max_decode_length": 97 + decode["extra_length"],
                        "data_dir": "unread (compile-only: WMT14 is described)"},
          "notes": f"packed rows of 256 tokens; {d['run_and_time']['iterations_per_loop']} steps "
                   f"per epoch; beam search on the device after every epoch, BLEU on the host"}


_GOOGLE = {"resnet": _resnet, "ssd": _ssd, "transformer": _transformer}


def _google_point(d: dict[str, Any], built: dict[str, Any], name: str, preset: str,
                  repo: str) -> dict[str, Any]:
  """One point of a points file from a derived point `d` of Google's logs and its config
  (`built`: mesh, global_batch_size, overrides, notes)."""
  m = d["measured"]
  return {
      "name": name, "benchmark": d["benchmark"], "preset": preset, "topology": d["topology"],
      "mesh": built["mesh"], "global_batch_size": built["global_batch_size"],
      "overrides": built["overrides"], "train_steps": d["train_steps"],
      "evaluations": d["evaluations"],
      "host": {"startup_s": m["startup_s"], "final_scoring_s": m["tail_s"]}
              | ({INPUT_HOSTS: built["input_hosts"]} if "input_hosts" in built else {}),
      "published_minutes": d["published_minutes"], "measured": m, "notes": built["notes"],
      "source": [repo + s for s in d["sources"]],
      "facts": {"system": d["system"], "logs": d["logs"], "epochs_per_log": d["epochs_per_log"],
                "converged_epochs": d["converged_epochs"], "hparams": d["hparams"],
                "run_and_time": d["run_and_time"]}}


def from_google(derived: dict[str, Any]) -> dict[str, Any]:
  """The points file of Google's submissions from `tools.pod.google_v06.derive`'s
  figures: each point's config over the benchmark's tpu-v3-2048 preset, the steps and
  evaluations of its logs, the host terms they measured and every measured figure."""
  repo = REPO.replace("master", derived["source"].get("commit") or "master")
  points = [_google_point(d, _GOOGLE[d["benchmark"]](d), f"{d['benchmark']}-{d['chips']}",
                         PRESET, repo) for d in derived["points"]]
  return {"about": "Google's MLPerf v0.6 closed-division TPU-v3 submissions (16 to 1024 chips), "
                   "from their result logs, command lines and runners: " + derived["source"]
                   ["derived_by"], "source": derived["source"],
          # SSD's steps follow the images each host feeds (docs/pod.md): the hosts' line is
          # fitted on the smallest slice (256 images a host) and the smallest at 32 a host.
          "host_fit_on": "ssd-16,ssd-128", "points": points}


def mape(pairs) -> float | None:
  """Mean absolute percentage error of (modelled, measured) pairs (None without pairs)."""
  errors = [abs(m / r - 1) for m, r in pairs if r]
  return 100 * statistics.mean(errors) if errors else None


# --- Google's MLPerf v0.7 TPU-v4 ResNet and SSD submissions, from their logs ----------------------

REPO_V07 = "https://github.com/mlcommons/training_results_v0.7/tree/master/"
PRESET_V4 = "tpu-v4-128"


def _v07_hosts(run_and_time: dict[str, Any]) -> int:
  # util/train_and_eval_runner.py: one input pipeline (dataset_index) per host, each feeding
  # --replicas_per_host replicas (its default 8): num_replicas // replicas_per_host of them.
  replicas = run_and_time.get("num_replicas") or run_and_time["num_shards"]
  return max(1, replicas // run_and_time.get("replicas_per_host", 8))


def _resnet_v07(d: dict[str, Any]) -> dict[str, Any]:
  # run_and_time.sh: --steps_per_eval = 4 epochs at 8192 (16 at 2048); the lr schedule spans
  # --train_steps (schedule_epochs); model_bn_span as logged (the per-replica batch x
  # --distributed_group_size).
  h, f = d["hparams"], d["run_and_time"]
  batch = d["global_batch_size"]
  images = h["train_samples"]
  # From 256 chips, without the preset's weight-update sharding: libtpu (0.0.42.1) sums the
  # gradients and gathers the 1/256 blocks in all-reduces, 151.8 MB a step against 55.9 MB for
  # the plain gradient sum, and the step is 16.6 ms modelled against 15.3 (2026-12-06); at 64
  # chips sharding the update is the faster program (44.0 against 45.0 ms).
  whole = {"optimizations": "distributed_eval"} if d["chips"] >= 256 else {}
  return {"mesh": "data:-1", "global_batch_size": batch, "input_hosts": _v07_hosts(f),
          "overrides": {**whole, "eval_batch_size": f.get("eval_batch_size", batch),
                        "max_epochs": int(_median(d["epochs_per_log"])),
                        "eval_every": round(f["iterations_per_loop"] * batch / images),
                        "bn_span": d["model_bn_span"],
                        "base_learning_rate": float(h["lars_opt_base_learning_rate"]),
                        "warmup_epochs": float(h["lars_opt_learning_rate_warmup_epochs"]),
                        "weight_decay": h["lars_opt_weight_decay"],
                        "lars_epsilon": h["lars_epsilon"],
                        "schedule_epochs": round(f["train_steps"] * batch / images, 2)},
          "notes": f"{f['num_replicas']} replicas ({f['num_replicas'] // d['chips']} "
                   f"a chip); evaluation every {f['iterations_per_loop']} steps, in the training "
                   f"loop's device program"}


def _ssd_v07(d: dict[str, Any]) -> dict[str, Any]:
  # Google's epochs are of its logged train_samples (118,287 images) and its lr drops in them
  # (logged, or run_and_time.sh's --hparams first/second_lr_drop_epoch); the points give
  # meshperf's epochs of COCO's 117,266 annotated images: steps / meshperf's steps per epoch.
  h, f = d["hparams"], d["run_and_time"]
  batch = d["global_batch_size"]
  per_epoch = _COCO_TRAIN // batch
  google_epoch = h["train_samples"] / batch
  hp = f.get("hparams") or {}
  drops = h.get("opt_learning_rate_decay_boundary_epochs") or [
      hp.get("first_lr_drop_epoch", 40), hp.get("second_lr_drop_epoch", 50)]
  every = f["iterations_per_loop"]
  evals = [k * every for k in range(1, round(d["evaluations"]) + 1)]
  return {"mesh": "data:-1", "global_batch_size": batch, "input_hosts": _v07_hosts(f),
          "overrides": {
              "eval_batch_size": f.get("eval_batch_size", batch), "bn_span": d["model_bn_span"],
              "base_learning_rate": h["opt_base_learning_rate"],
              "warmup_steps": h["opt_learning_rate_warmup_steps"], "warmup_factor": 0.0,
              "decay_epochs": [round(e * google_epoch / per_epoch) for e in drops],
              "weight_decay": h["opt_weight_decay"],
              "max_epochs": round(d["train_steps"] / per_epoch),
              "eval_epochs": [round(s / per_epoch) for s in evals[:-1]]},
          "notes": f"{f['num_shards']} replicas ({f['num_shards'] // d['chips']} a chip); "
                   f"predictions on the device every {every} steps inside the training program; "
                   f"COCO scoring on host processes while training goes on, except the "
                   f"converged one's"}


_GOOGLE_V07 = {"resnet": _resnet_v07, "ssd": _ssd_v07}


def from_google_v07(derived: dict[str, Any]) -> dict[str, Any]:
  """The points file of Google's v0.7 TPU-v4 ResNet and SSD submissions from
  `tools.pod.google_v07.derive`'s figures, over each benchmark's `tpu-v4-128` preset."""
  repo = REPO_V07.replace("master", derived["source"].get("commit") or "master")
  out = [_google_point(d, _GOOGLE_V07[d["benchmark"]](d), f"{d['benchmark']}-v4-{d['chips']}",
                       PRESET_V4, repo) for d in derived["points"]]
  return {"about": "Google's MLPerf v0.7 closed-division TPU-v4 ResNet-50 and SSD submissions (8, "
                   "64 and 256 chips), from their result logs, command lines and runners: "
                   + derived["source"]["derived_by"], "source": derived["source"],
          # As v0.6's: the smallest slice (256 images a host) and the smallest at 32 a host.
          "host_fit_on": "ssd-v4-8,ssd-v4-64", "points": out}
