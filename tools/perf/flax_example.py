"""Times flax's own ImageNet example against `tools.perf.baseline`, which is written to be
it: the check that the baseline `./run.sh perf` measures meshperf against is as fast as the
example the field uses. A development-time tool: it needs a checkout of github.com/google/flax.

  python -m tools.perf.flax_example --flax_dir=/path/to/flax [--devices=all,1]

From the checkout it imports `examples/imagenet/models.py` as it is, and from
`examples/imagenet/train.py` it takes the functions the training step uses
(`cross_entropy_loss`, `compute_metrics`, `create_learning_rate_fn`, `train_step`) without
importing the module (which needs TensorFlow for its input pipeline). It builds the state as
the example's `create_train_state` does and pmaps `train_step` as its `train_and_evaluate` does;
then the two steps take turns on the same batch (`tools.perf.timing`) and it prints the
per-step times, the median of the per-round ratios with quartiles, the CPU-time ratio, both
programs' FLOPs and all-reduces.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import os
import statistics
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import common_utils
from jax import lax

from runtime import backend
from tools.perf import handwritten, timing
from tools.perf.baseline import Baseline, TrainState, learning_rate_fn

WANTED = ("cross_entropy_loss", "compute_metrics", "create_learning_rate_fn", "train_step")


def load_example(flax_dir: str):
  """(models module, namespace holding train.py's WANTED functions)."""

  root = os.path.join(flax_dir, "examples", "imagenet")
  spec = importlib.util.spec_from_file_location("flax_imagenet_models",
                                                os.path.join(root, "models.py"))
  models = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(models)
  with open(os.path.join(root, "train.py")) as f:
    tree = ast.parse(f.read())
  funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in WANTED]
  missing = set(WANTED) - {f.name for f in funcs}
  if missing:
    raise ValueError(f"{root}/train.py has no {', '.join(sorted(missing))}; this tool reads "
                     f"the example as flax's main branch wrote it in 2026")
  ns = dict(jax=jax, jnp=jnp, lax=lax, optax=optax, functools=functools,
            common_utils=common_utils, NUM_CLASSES=1000)
  exec(compile(ast.Module(body=funcs, type_ignores=[]), f"{root}/train.py", "exec"), ns)
  return models, ns


def _example_state():


  class ExampleState(TrainState):
    """The example's TrainState also holds `dynamic_scale` (None without half precision),
    which its train_step reads."""
    dynamic_scale: Any = None
  return ExampleState


def prepare_example(models, ns, devs, a, lr_fn):
  """The example's initial state (on one device, as `create_train_state` leaves it) and its
  pmapped step on `devs`."""

  model = models.ResNet50(num_classes=a.num_classes, dtype=jnp.float32)
  variables = jax.jit(model.init)({"params": jax.random.key(a.seed)},
                                  jnp.ones((1, a.image_size, a.image_size, 3), jnp.float32))
  state = _example_state().create(apply_fn=model.apply, params=variables["params"],
                                  tx=optax.sgd(lr_fn, momentum=0.9, nesterov=True),
                                  batch_stats=variables["batch_stats"], dynamic_scale=None)
  step = jax.pmap(functools.partial(ns["train_step"], learning_rate_fn=lr_fn),
                  in_axes=(None, 0), out_axes=(None, 0), axis_name="batch", devices=devs)
  return step, state


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m tools.perf.flax_example",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("--flax_dir", required=True, help="a checkout of github.com/google/flax")
  p.add_argument("--devices", default="all,1")
  p.add_argument("--rounds", type=int, default=10)
  p.add_argument("--steps", type=int, default=2, help="steps per program per round")
  p.add_argument("--image_size", type=int, default=64)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--num_cpu_devices", type=int, default=8)
  a = p.parse_args(argv)
  a.num_classes, a.seed = 1000, 0
  specs = a.devices.split(",")
  if not all(x == "all" or (x.isdigit() and 1 <= int(x) <= a.num_cpu_devices) for x in specs):
    print(f"error: --devices={a.devices}: give device counts from 1 to {a.num_cpu_devices} or "
          f"'all', separated by commas", file=sys.stderr)
    return 2
  if min(a.rounds, a.steps, a.batch, a.image_size) < 1:
    print("error: --rounds, --steps, --batch and --image_size must be at least 1",
          file=sys.stderr)
    return 2
  if not os.path.isfile(os.path.join(a.flax_dir, "examples", "imagenet", "models.py")):
    print(f"error: --flax_dir={a.flax_dir} holds no examples/imagenet/models.py; give a "
          f"checkout of github.com/google/flax", file=sys.stderr)
    return 2
  backend.use_cpu_devices(a.num_cpu_devices)

  try:
    models, ns = load_example(a.flax_dir)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  rng = np.random.default_rng(0)
  local = {"image": rng.standard_normal((a.batch, a.image_size, a.image_size, 3), np.float32),
           "label": rng.integers(0, a.num_classes, a.batch).astype(np.int32)}
  lr_fn = learning_rate_fn(0.1, 5, 100)
  for spec in specs:
    devs = jax.devices() if spec == "all" else jax.devices()[:int(spec)]
    n = len(devs)
    if a.batch % n:
      print(f"error: --batch={a.batch} does not split over {n} devices; give a multiple of {n}",
            file=sys.stderr)
      return 2
    base = Baseline(devs, 50, 64, a.num_classes, a.image_size, a.batch, lr=lr_fn, seed=a.seed)
    batch = base.shard_batch(local["image"], local["label"])
    ex_step, ex_state = prepare_example(models, ns, devs, a, lr_fn)
    # Both states placed as the steady state is (`Baseline.replicated`).
    ex = handwritten.prepared("example", ex_step, base.replicated(ex_state), batch, local)
    bl = handwritten.prepared("baseline", base.pmapped, base.init(), batch, local)
    got = handwritten.alternate(ex, bl, a.rounds, a.steps, 1, lambda line: print(
        f"  {n} devices, {line.strip()}", flush=True))
    wall, cpu = (timing.ratios(got[k]["baseline"], got[k]["example"]) for k in ("wall", "cpu"))
    ms = {k: statistics.median(v) * 1e3 for k, v in got["wall"].items()}
    q = timing.quartiles(wall)
    f = {p.name: p.cost["flops_per_device"] for p in (ex, bl)}
    ar = {p.name: p.cost["collectives"].get("all-reduce", {}).get("count") for p in (ex, bl)}
    print(f"{n} devices: example {ms['example']:.0f} ms/step, baseline {ms['baseline']:.0f} "
          f"ms/step; baseline / example wall {statistics.median(wall):.3f} "
          f"({q[0]:.3f}-{q[1]:.3f}), CPU {statistics.median(cpu):.3f}; FLOPs per device "
          f"{f['example'] / 1e9:.2f} G vs {f['baseline'] / 1e9:.2f} G; "
          f"all-reduces {ar['example']} vs {ar['baseline']}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
