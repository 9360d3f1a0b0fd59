"""Times flax's own ImageNet example against `benchmarks.perf.baseline`, which is written to be
it: the check that the baseline `./run.sh perf` measures meshperf against is as fast as the
example the field uses. A development-time tool: it needs a checkout of github.com/google/flax.

  python -m benchmarks.perf.flax_example --flax_dir=/path/to/flax [--devices=all,1]

From the checkout it imports `examples/imagenet/models.py` as it is, and from
`examples/imagenet/train.py` it takes the functions the training step uses
(`cross_entropy_loss`, `compute_metrics`, `create_learning_rate_fn`, `train_step`) without
importing the module (which needs TensorFlow for its input pipeline). It builds the state as
the example's `create_train_state` does and pmaps `train_step` as its `train_and_evaluate` does;
then the two steps take turns on the same batch (`benchmarks.perf.timing`) and it prints the
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
import time

WANTED = ("cross_entropy_loss", "compute_metrics", "create_learning_rate_fn", "train_step")


def load_example(flax_dir: str):
  """(models module, namespace holding train.py's WANTED functions)."""
  import jax
  import jax.numpy as jnp
  import optax
  from flax.training import common_utils
  from jax import lax

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
  from typing import Any

  from benchmarks.perf.baseline import TrainState

  class ExampleState(TrainState):
    """The example's TrainState also holds `dynamic_scale` (None without half precision),
    which its train_step reads."""
    dynamic_scale: Any = None
  return ExampleState


def prepare_example(models, ns, devs, a, local, lr_fn):
  """The example's state and pmapped step on `devs`, and its batch."""
  import jax
  import jax.numpy as jnp
  import optax

  model = models.ResNet50(num_classes=a.num_classes, dtype=jnp.float32)
  variables = jax.jit(model.init)({"params": jax.random.key(a.seed)},
                                  jnp.ones((1, a.image_size, a.image_size, 3), jnp.float32))
  state = _example_state().create(apply_fn=model.apply, params=variables["params"],
                           tx=optax.sgd(lr_fn, momentum=0.9, nesterov=True),
                           batch_stats=variables["batch_stats"], dynamic_scale=None)
  step = jax.pmap(functools.partial(ns["train_step"], learning_rate_fn=lr_fn),
                  in_axes=(None, 0), out_axes=(None, 0), axis_name="batch", devices=devs)
  n = len(devs)
  batch = jax.pmap(lambda b: b, devices=devs)(
      {"image": local["image"].reshape((n, -1) + local["image"].shape[1:]),
       "label": local["label"].reshape((n, -1))})
  return step, state, batch


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m benchmarks.perf.flax_example",
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
  if not os.path.isfile(os.path.join(a.flax_dir, "examples", "imagenet", "models.py")):
    print(f"error: --flax_dir={a.flax_dir} holds no examples/imagenet/models.py; give a "
          f"checkout of github.com/google/flax", file=sys.stderr)
    return 2
  from mesh import devices
  devices.use_cpu_devices(a.num_cpu_devices)
  import jax
  import numpy as np

  from benchmarks.perf import timing
  from benchmarks.perf.baseline import Baseline, learning_rate_fn
  from mesh import cost
  try:
    models, ns = load_example(a.flax_dir)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  rng = np.random.default_rng(0)
  local = {"image": rng.standard_normal((a.batch, a.image_size, a.image_size, 3), np.float32),
           "label": rng.integers(0, a.num_classes, a.batch).astype(np.int32)}
  lr_fn = learning_rate_fn(0.1, 5, 100)
  for spec in a.devices.split(","):
    devs = jax.devices() if spec == "all" else jax.devices()[:int(spec)]
    n = len(devs)
    ex_step, ex_state, ex_batch = prepare_example(models, ns, devs, a, local, lr_fn)
    base = Baseline(devs, 50, 64, a.num_classes, a.image_size, a.batch, lr=lr_fn, seed=a.seed)
    ex_state = base.replicated(ex_state)    # the steady state's placement, as for the baseline
    b_state, b_batch = base.init(), base.shard_batch(local["image"], local["label"])
    progs = {"example": [ex_step, ex_state, ex_batch], "baseline": [base._step, b_state, b_batch]}
    counts = {}
    for name, (fn, state, batch) in progs.items():
      compiled = fn.lower(state, batch).compile()
      c = cost.analyze(compiled)
      counts[name] = (c["flops_per_device"], c["collectives"].get("all-reduce", {}).get("count"))

    def run(name):
      fn, state, batch = progs[name]
      t0, c0 = time.perf_counter(), time.process_time()
      for _ in range(a.steps):
        state, metrics = fn(state, batch)
      jax.block_until_ready((state, metrics))
      progs[name][1] = state
      return (time.perf_counter() - t0) / a.steps, (time.process_time() - c0) / a.steps

    for name in progs:
      run(name)                                                     # warm-up

    def said(r, g):
      print(f"  {n} devices, round {r + 1}/{a.rounds}: " + ", ".join(
          f"{k} {v[-1][0] * 1e3:.0f} ms" for k, v in g.items()), flush=True)
    got = timing.take_turns({k: functools.partial(run, k) for k in progs}, a.rounds, "alternate",
                            said)
    wall = timing.ratios([w for w, _ in got["baseline"]], [w for w, _ in got["example"]])
    cpu = timing.ratios([c for _, c in got["baseline"]], [c for _, c in got["example"]])
    ms = {k: statistics.median(w for w, _ in v) * 1e3 for k, v in got.items()}
    q = timing.quartiles(wall)
    print(f"{n} devices: example {ms['example']:.0f} ms/step, baseline {ms['baseline']:.0f} "
          f"ms/step; baseline / example wall {statistics.median(wall):.3f} "
          f"({q[0]:.3f}-{q[1]:.3f}), CPU {statistics.median(cpu):.3f}; FLOPs per device "
          f"{counts['example'][0] / 1e9:.2f} G vs {counts['baseline'][0] / 1e9:.2f} G; "
          f"all-reduces {counts['example'][1]} vs {counts['baseline'][1]}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
