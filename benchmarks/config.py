"""Configs as data: frozen dataclasses, presets by name, overrides from flags.

Every benchmark's Config extends `Common`. Each field can be overridden by an absl flag of the
same name (`harness.cli` defines one flag per field), so presets are plain data.
This module does not import jax: `num_cpu_devices` must act before jax starts.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import re
import tempfile
from typing import Any, Callable, Iterable

from runtime.errors import UserError


@dataclasses.dataclass(frozen=True)
class Common:
  """Fields the shared training loop reads."""
  # Devices and sharding.
  num_cpu_devices: int = 8          # >0: simulate this many CPU devices; 0: use real devices
  mesh: str = "data:-1"             # Mesh-TensorFlow mesh spec
  layout: str = "batch:data"        # logical dimension -> mesh axes
  optimizations: str = "none"       # none, or a list like grad_accum:4,distributed_eval
  dtype: str = "float32"            # compute dtype: float32, bfloat16 (float64 for exactness tests)
  remat: str = "none"               # recompute in the backward pass: none; full (keep each layer's
                                    # output only); dots (also keep matmul outputs)
  state_layouts: str = "default"    # each train-state array's layout in a device's memory
                                    # (STATE_LAYOUTS): default, jax's; auto, the compiler's choice
  xla_flags: str = ""               # XLA flags the run adds to XLA_FLAGS before jax starts
  libtpu_flags: str = ""            # the TPU compiler's flags the run adds to LIBTPU_INIT_ARGS
                                    # before libtpu loads (`runtime.tpu_flags`)
  # Run length and evaluation.
  global_batch_size: int = 64
  eval_batch_size: int = 0          # 0: same as global_batch_size
  max_epochs: int = 10              # the run stops here (exit status 1) if the target is not met
  eval_every: int = 1               # epochs per block; evaluation after each block
  eval_epochs: tuple[int, ...] = ()   # e.g. 40,50,55: evaluate after these epochs (and the last)
  eval_every_samples: int = 0       # samples-cadence benchmarks: training samples between evals
  seed: int = 0
  # Data.
  dataset: str = ""
  data_dir: str = ""
  data_workers: int = 0             # input processes (ImageNet, COCO); 0: threads; same batches


REMAT = ("none", "full", "dots")   # `benchmarks.common.layers.remat`
# The memory layouts of the train state (`--state_layouts`; jax.experimental.layout, "Device-
# local array layout control", https://docs.jax.dev/en/latest/notebooks/layout.html): `default`,
# the layout jax gives every array of its shape (dimensions in order, the backend's default
# tiling); `auto`, the one the compiler chooses for each array of the train step's state
# (`Layout.AUTO`), which the state then keeps from its initialization on: the step's own
# kernels read and write it without copying it into another order first. The same values
# either way; on a CPU the compiler chooses the default.
STATE_LAYOUTS = ("default", "auto")
# How attention runs (`--attention`, the Transformer and the LM): `xla`, jax's XLA
# implementation on every backend; `cudnn`, cuDNN's fused kernel (jax.nn.dot_product_attention's
# `implementation="cudnn"`: NVIDIA GPUs, bfloat16 or float16, no dropout on the weights).
ATTENTION = ("xla", "cudnn")
# Where dropout's random bits come from (`--dropout_rng`, the Transformer and the LM):
# `threefry`, jax's default generator (Salmon et al., SC 2011), which draws the same bits under
# every layout (jax_threefry_partitionable), so runs of different layouts are comparable bit
# for bit; `rbg`, jax's "rbg" keys, whose bits come from XLA's RngBitGenerator (the backend's
# own algorithm; splits and fold-ins stay threefry), which depend on the backend and on how the
# masks are split. On a TPU, threefry's 20 rounds of 32-bit additions, rotations and xors run on
# the vector unit for every draw (docs/pod.md measures what that costs the Transformer).
DROPOUT_RNG = ("threefry", "rbg")
# The dtype of the attention's softmax (`--softmax_dtype`, the Transformer; jax's attention
# path, `--attention=xla`): `float32`, whatever the compute dtype; `compute`, the compute dtype
# (`--dtype`), as Google's MLPerf v0.6 Transformer had it: tensor2tensor's
# `dot_product_attention` casts the logits to float32 only under float16 activations
# (`common_attention.maybe_upcast`), so with bfloat16 ones its softmax ran in bfloat16.
SOFTMAX = ("float32", "compute")
# The backward pass of the stem's 3x3 max pool (`--pool_backward`, ResNet and SSD): `xla`, XLA's
# select-and-scatter (jax's reduce_window transpose); `index`, `convnet.relu_max_pool_3x3`'s, which
# saves which of the 9 window positions won (int8) and places the gradient by 9 dilated pads.
# The same values and gradients; `index` is the GPU presets' (fewer bytes through XLA's GPU
# compiler), `xla` the TPU's (the TPU compiler's select-and-scatter is the cheaper there:
# docs/gpu.md and docs/pod.md give both).
POOL_BACKWARDS = ("xla", "index")
# The backward pass of a residual block's last ReLU (`--relu_backward`, ResNet and SSD): `output`,
# `convnet.relu_by_output`'s, which reads the ReLU's output (saved anyway as the next block's
# input); `mask`, `convnet.relu_by_mask`'s, which reads where the input was positive, saved as
# one byte an element. The same values and gradients; `mask` is the ResNet GPU preset's (XLA's
# GPU compiler then fuses the first stage's ReLU backward into batch norm's, docs/gpu.md),
# `output` everyone else's (the mask is one more buffer a block: the TPU compiler's ResNet step
# is the slower with it).
RELU_BACKWARDS = ("output", "mask")


def _kind(value: Any) -> str | None:
  """What a config value is, as overrides must match it: None for a field without a value."""
  if value is None:
    return None
  for kind, types in (("true or false", bool), ("an integer", int), ("a number", float),
                      ("a string", str), ("a list", tuple)):
    if isinstance(value, types):
      return kind
  return type(value).__name__


def _fits(value: Any, kind: str | None) -> bool:
  if kind is None:
    return isinstance(value, (str, int, float)) or value is None
  if isinstance(value, bool):
    return kind == "true or false"
  if kind == "a number":
    return isinstance(value, (int, float))
  if kind == "a list":          # of numbers or strings, or of such lists (SSD's aspect ratios)
    return isinstance(value, tuple) and all(
        _fits(v, "a list") if isinstance(v, tuple) else
        isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in value)
  return _kind(value) == kind


def replace(config: Any, overrides: dict[str, Any]) -> Any:
  """A copy of `config` with the given fields replaced: unknown names and values of another
  kind than the field's (a string for an integer, a list for a number) are errors, named."""
  names = {f.name for f in dataclasses.fields(config)}
  unknown = sorted(set(overrides) - names)
  if unknown:
    raise UserError(f"unknown config field(s) {', '.join(unknown)}")
  for name, value in overrides.items():
    kind = _kind(getattr(config, name))
    if not _fits(value, kind):
      raise UserError(f"config field {name}: {value!r} is not {kind or 'a value'} (the preset "
                      f"has {getattr(config, name)!r})")
  return dataclasses.replace(config, **overrides)


def preset(presets: dict[str, Any], name: str, benchmark: str) -> Any:
  if name not in presets:
    raise UserError(f"unknown --config '{name}' for {benchmark}; choose one of "
                    f"{', '.join(sorted(presets))}")
  return presets[name]


def eval_points(c: Common) -> tuple[int, ...]:
  """The epochs after which an epochs-cadence run evaluates: every `eval_every` epochs, or the
  `eval_epochs` list; always the last epoch."""
  if c.eval_epochs:
    listed = sorted(set(c.eval_epochs))
    if listed[0] < 1:
      raise UserError(f"--eval_epochs={','.join(map(str, c.eval_epochs))}: epochs count from 1")
    points = [e for e in listed if e < c.max_epochs]
  else:
    points = list(range(c.eval_every, c.max_epochs, c.eval_every))
  return tuple(points) + (c.max_epochs,)


def require(c: Any, fields: Iterable[str], ok: Callable[[Any], bool], what: str) -> None:
  """Raises UserError `--field=value: what` for the first field whose value is not `ok` (NaN
  fails every comparison, so `lambda v: v > 0` also refuses it)."""
  for field in fields:
    value = getattr(c, field)
    if not ok(value):
      raise UserError(f"--{field}={value}: {what}")


def positive(v) -> bool:
  return v > 0 and not math.isinf(v)


def non_negative(v) -> bool:
  return v >= 0 and not math.isinf(v)


def fraction(v) -> bool:
  """In [0, 1): dropout rates, label smoothing, momentum, decay rates."""
  return 0 <= v < 1


def check_attention(c) -> None:
  """`--attention`: a known implementation, and for cuDNN's what its fused kernel takes (the
  backend is checked when the devices are known, `benchmarks.common.transformer`)."""
  if c.attention not in ATTENTION:
    raise UserError(f"--attention={c.attention}: choose one of {', '.join(ATTENTION)}")
  if c.attention == "cudnn" and c.dtype != "bfloat16":
    raise UserError(f"--attention=cudnn runs cuDNN's fused kernel, in bfloat16 only (got "
                    f"--dtype={c.dtype}): pass --dtype=bfloat16 or --attention=xla")
  if c.attention == "cudnn" and c.attention_dropout > 0:
    raise UserError(f"--attention=cudnn: cuDNN's fused kernel has no dropout on the attention "
                    f"weights (--attention_dropout={c.attention_dropout}): pass "
                    f"--attention_dropout=0 or --attention=xla")


def check_softmax(c) -> None:
  if c.softmax_dtype not in SOFTMAX:
    raise UserError(f"--softmax_dtype={c.softmax_dtype}: choose one of {', '.join(SOFTMAX)}")
  if c.softmax_dtype == "compute" and c.attention == "cudnn":
    raise UserError("--softmax_dtype=compute is jax's attention's (--attention=xla); cuDNN's "
                    "fused kernel keeps its own: pass --softmax_dtype=float32")


def check_pool_backward(c) -> None:
  if c.pool_backward not in POOL_BACKWARDS:
    raise UserError(f"--pool_backward={c.pool_backward}: choose one of "
                    f"{', '.join(POOL_BACKWARDS)} (index for NVIDIA GPUs, xla elsewhere)")


def check_relu_backward(c) -> None:
  if c.relu_backward not in RELU_BACKWARDS:
    raise UserError(f"--relu_backward={c.relu_backward}: choose one of "
                    f"{', '.join(RELU_BACKWARDS)} (mask for NVIDIA GPUs, output elsewhere)")


def check_dropout_rng(c) -> None:
  if c.dropout_rng not in DROPOUT_RNG:
    raise UserError(f"--dropout_rng={c.dropout_rng}: choose one of {', '.join(DROPOUT_RNG)}")


# Bounds checked before anything is sized by them: a run's seed is drawn by numpy, grain and
# jax, which take 32-bit (numpy's legacy generator) or 64-bit seeds, so 32 bits serve all; the
# epochs bound the run's list of evaluations.
MAX_SEED = 2**32 - 1
MAX_EPOCHS = 100_000


def check_adam_and_perplexity(c) -> None:
  """A language model's Adam(W) with a decaying rate and its log-perplexity target: the end rate
  at most the base, betas in [0, 1), a positive target."""
  if c.end_learning_rate > c.base_learning_rate:
    raise UserError(f"--end_learning_rate={c.end_learning_rate} is above --base_learning_rate="
                    f"{c.base_learning_rate}; the schedule decays from base to end")
  for field in ("adam_beta1", "adam_beta2"):
    if not 0 <= getattr(c, field) < 1:
      raise UserError(f"--{field} must be in [0, 1) (got {getattr(c, field)})")
  if c.target_log_perplexity <= 0:
    raise UserError(f"--target_log_perplexity={c.target_log_perplexity}: eval nats per token, "
                    f"a positive number (lower is better)")


def check_finite(c: Any) -> None:
  """No number field of a config is NaN or infinite: every comparison with NaN is false, so a
  NaN target would never be reached (the run trains to its epoch limit) and a NaN rate trains
  nothing."""
  for f in dataclasses.fields(c):
    values = getattr(c, f.name)
    for v in (values if isinstance(values, tuple) else (values,)):
      if isinstance(v, float) and not math.isfinite(v):
        raise UserError(f"--{f.name}={v}: give a finite number")


# Steps of a schedule are int32 in the compiled step (jax's default integer): a longer warmup
# or schedule overflows it there, past every check.
MAX_STEPS = 2**31 - 1


def check_schedule_lengths(c: Any) -> None:
  """Epoch counts of a schedule (`*_epochs`) at most MAX_EPOCHS, step counts (`*_steps`) at
  most MAX_STEPS: a value past them is a typo, and reaches the compiled step as an integer
  it cannot hold."""
  for f in dataclasses.fields(c):
    v = getattr(c, f.name)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
      continue
    shown = f"{v:g}" if isinstance(v, float) else v
    if f.name.endswith("_epochs") and v > MAX_EPOCHS:
      raise UserError(f"--{f.name}={shown}: at most {MAX_EPOCHS:,} epochs")
    if f.name.endswith("_steps") and v > MAX_STEPS:
      raise UserError(f"--{f.name}={shown}: at most {MAX_STEPS:,} steps")


def validate_common(c: Common) -> None:
  check_finite(c)
  if c.dtype not in ("float32", "bfloat16", "float64"):
    raise UserError(f"--dtype={c.dtype}: choose float32 or bfloat16 (float64: exactness checks)")
  if c.remat not in REMAT:
    raise UserError(f"--remat={c.remat}: choose one of {', '.join(REMAT)}")
  if c.state_layouts not in STATE_LAYOUTS:
    raise UserError(f"--state_layouts={c.state_layouts}: choose one of "
                    f"{', '.join(STATE_LAYOUTS)}")
  if c.num_cpu_devices < 0:
    raise UserError(f"--num_cpu_devices={c.num_cpu_devices}: simulate N >= 1 CPU devices, or "
                    f"pass 0 to use the real devices")
  if c.seed < 0:
    raise UserError(f"--seed={c.seed}: seeds are integers >= 0")
  if c.seed > MAX_SEED:
    raise UserError(f"--seed={c.seed}: seeds are 32-bit, at most {MAX_SEED}")
  for field in ("global_batch_size", "max_epochs", "eval_every"):
    if getattr(c, field) <= 0:
      raise UserError(f"--{field} must be positive (got {getattr(c, field)})")
  if c.max_epochs > MAX_EPOCHS:
    raise UserError(f"--max_epochs={c.max_epochs}: at most {MAX_EPOCHS:,} (MLPerf's benchmarks "
                    f"converge in tens of epochs)")
  check_schedule_lengths(c)
  eval_points(c)
  if c.eval_every_samples < 0:
    raise UserError(f"--eval_every_samples must be >= 0 (got {c.eval_every_samples})")
  if c.data_workers < 0:
    raise UserError(f"--data_workers={c.data_workers}: the number of input worker processes, "
                    f">= 0 (0: threads in this process)")
  if c.eval_batch_size < 0:
    raise UserError(f"--eval_batch_size must be >= 0 (got {c.eval_batch_size})")


# --- paths a run will write ---------------------------------------------------------------------

def nearest_existing(path: str) -> str:
  """`path`, or the deepest of its parent folders that exists (made absolute)."""
  path = os.path.abspath(path)
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return path


def _check_components(flag: str, path: str) -> None:
  """Each part of `path` that does not exist yet can be made: it is not a symbolic link that
  leads nowhere (a dangling link, a loop: `exists` is false, yet nothing can be made there) and
  its name and the whole path fit the file system's limits (NAME_MAX, PATH_MAX)."""
  parts, p = [], path
  while not os.path.exists(p):
    if os.path.islink(p):
      try:
        os.stat(p)
        why = "leads nowhere"
      except OSError as e:
        why = ("in a loop of links" if e.errno == errno.ELOOP else
               f"to {os.readlink(p)}, which does not exist")
      raise UserError(f"{flag}={path}: {p} is a symbolic link {why}; remove or fix the link, or "
                      f"choose another path")
    parts.append(os.path.basename(p))
    p = os.path.dirname(p)
  if not parts:
    return
  try:
    name_max, path_max = os.pathconf(p, "PC_NAME_MAX"), os.pathconf(p, "PC_PATH_MAX")
  except (OSError, ValueError):
    return
  long = [n for n in parts if len(os.fsencode(n)) > name_max]
  if long:
    raise UserError(f"{flag}={path[:80]}...: the name {long[-1][:40]}... is "
                    f"{len(os.fsencode(long[-1]))} "
                    f"bytes; the file system under {p} allows {name_max}; choose a shorter name")
  if len(os.fsencode(path)) >= path_max:
    raise UserError(f"{flag}={path[:60]}...: the path is {len(os.fsencode(path))} bytes; the file "
                    f"system allows {path_max - 1}; choose a shorter path")


def check_writable(flag: str, path: str, kind: str = "folder") -> None:
  """Raises UserError unless `path` (a folder, or a file with kind="file") is, or can be made,
  and written: it is not a file where a folder is meant (or a folder where a file is), no file
  lies on its way, and the deepest folder that exists takes a new file. Checked by writing and
  removing a temporary file there (permission bits do not stop root; a read-only or virtual file
  system does): nothing is left behind. A URL (`gs://bucket/...`, `s3://...`) is refused: runs
  write through the local file system, so a bucket is written through a mount of it."""
  scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", path)
  if scheme:
    raise UserError(f"{flag}={path}: a {scheme.group(1)}:// URL, not a local path; meshperf "
                    f"writes through the file system, so mount the bucket (e.g. gcsfuse for "
                    f"gs://) and pass the mounted folder")
  path = os.path.abspath(os.path.expanduser(path))
  _check_components(flag, path)
  if kind == "folder" and os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{flag}={path} is a file; name a folder (it is made if missing)")
  if kind == "file" and os.path.isdir(path):
    raise UserError(f"{flag}={path} is a folder; name a file")
  base = nearest_existing(path if kind == "folder" else os.path.dirname(path))
  if not os.path.isdir(base):
    raise UserError(f"{flag}={path}: {base} is a file, so nothing can be made under it; choose "
                    f"another path")
  try:
    fd, probe = tempfile.mkstemp(prefix=".meshperf-write-check-", dir=base)
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    raise UserError(f"{flag}={path}: cannot write in {base} ({e.strerror}); choose a path you "
                    f"can write") from None
