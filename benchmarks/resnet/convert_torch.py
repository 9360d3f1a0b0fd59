"""torchvision ResNet weights -> this harness's Flax ResNet variables (.npz for warm starts).

Getting ImageNet-pretrained weights (once, on a machine with torch and torchvision):

  import torch, torchvision
  torch.save(torchvision.models.resnet34(weights="IMAGENET1K_V1").state_dict(), "resnet34.pth")

then converting them (torch is needed only here; the .npz needs no torch):

  python -m benchmarks.resnet.convert_torch --depth=34 resnet34.pth resnet34.npz

and `benchmarks.common.weights.load("resnet34.npz")` gives {"params", "batch_stats"}.

torchvision's pretrained ResNets take RGB images scaled to [0, 1] and then normalized with the
ImageNet mean (0.485, 0.456, 0.406) and standard deviation (0.229, 0.224, 0.225) per channel;
feed the converted weights the same inputs (NHWC here).

Mapping (torchvision ResNet-18/34/50/101/152 are ResNet v1.5, like `model.ResNet`):
  conv weights (out, in, kh, kw) -> kernel (kh, kw, in, out); fc.weight (out, in) -> (in, out);
  batch norm weight/bias -> params scale/bias, running_mean/running_var -> batch_stats mean/var
  (num_batches_tracked is dropped); conv1/bn1 -> stem/BatchNorm_0; layer{L}.{b} -> Block_k with
  k counting blocks over all stages; in a block conv{i}/bn{i} -> Conv_{i-1}/BatchNorm_{i-1} and
  downsample.0/.1 -> the last Conv_n/BatchNorm_n (the Flax block creates the projection last);
  fc -> Dense_0.
"""

from __future__ import annotations

import argparse
import functools
import pickle
import re
import sys
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from benchmarks.common import weights
from benchmarks.common.stages import STAGES
from benchmarks.resnet.model import ResNet
from runtime.errors import UserError

TORCHVISION_DEPTHS = (18, 34, 50, 101, 152)
_BN = {"weight": ("params", "scale"), "bias": ("params", "bias"),
       "running_mean": ("batch_stats", "mean"), "running_var": ("batch_stats", "var")}


@functools.lru_cache(maxsize=None)
def expected_shapes(depth: int, num_classes: int) -> dict[tuple[str, ...], tuple[int, ...]]:
  """{(collection, module..., name): shape} of ResNet(depth, 64, num_classes)'s variables."""

  model = ResNet(depth, 64, num_classes)
  shapes = jax.eval_shape(lambda r: nn.meta.unbox(
      model.init(r, jnp.zeros((1, 32, 32, 3), jnp.float32), train=False)), jax.random.PRNGKey(0))
  flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
  return {tuple(k.key for k in path): tuple(v.shape) for path, v in flat}


def _modules(depth: int, num_classes: int) -> dict[str, tuple[str, tuple[str, ...]]]:
  """torchvision module name -> (kind: conv | bn | fc, Flax module path)."""
  shapes = expected_shapes(depth, num_classes)
  stages, bottleneck = STAGES[depth]
  convs = 3 if bottleneck else 2
  out = {"conv1": ("conv", ("stem",)), "bn1": ("bn", ("BatchNorm_0",)), "fc": ("fc", ("Dense_0",))}
  k = 0
  for stage, blocks in enumerate(stages):
    for b in range(blocks):
      block, torch_block = f"Block_{k}", f"layer{stage + 1}.{b}"
      for i in range(convs):
        out[f"{torch_block}.conv{i + 1}"] = ("conv", (block, f"Conv_{i}"))
        out[f"{torch_block}.bn{i + 1}"] = ("bn", (block, f"BatchNorm_{i}"))
      if ("params", block, f"Conv_{convs}", "kernel") in shapes:     # a projection shortcut
        out[f"{torch_block}.downsample.0"] = ("conv", (block, f"Conv_{convs}"))
        out[f"{torch_block}.downsample.1"] = ("bn", (block, f"BatchNorm_{convs}"))
      k += 1
  return out


def _targets(kind: str, module: tuple[str, ...]) -> dict[str, tuple[tuple[str, ...], Any]]:
  """torch parameter name -> (Flax variable path, numpy transform) for one module."""
  if kind == "conv":
    return {"weight": (("params",) + module + ("kernel",), lambda w: w.transpose(2, 3, 1, 0))}
  if kind == "fc":
    return {"weight": (("params",) + module + ("kernel",), lambda w: w.T),
            "bias": (("params",) + module + ("bias",), lambda b: b)}
  return {name: ((col,) + module + (leaf,), lambda v: v) for name, (col, leaf) in _BN.items()}


def _strip_prefix(state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
  """Drops the "module." of weights saved from DataParallel."""
  if state_dict and all(k.startswith("module.") for k in state_dict):
    return {k[len("module."):]: v for k, v in state_dict.items()}
  return state_dict


def _set(tree: dict, path: tuple[str, ...], value: np.ndarray) -> None:
  for p in path[:-1]:
    tree = tree.setdefault(p, {})
  tree[path[-1]] = value


def _listed(keys: list[str]) -> str:
  more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
  return ", ".join(f"'{k}'" for k in keys[:3]) + more


def convert(state_dict: Mapping[str, Any], depth: int) -> dict[str, dict]:
  """torchvision ResNet-`depth` state dict (numpy values) -> {"params", "batch_stats"} of
  `ResNet(depth, 64, num_classes)`, float32. Every key must be used and every variable filled."""
  if depth not in STAGES:
    raise UserError(f"--depth={depth}: the Flax ResNet has depths {sorted(STAGES)} "
                    f"(torchvision: {', '.join(map(str, TORCHVISION_DEPTHS))})")
  state_dict = _strip_prefix(state_dict)
  fc = state_dict.get("fc.weight")
  num_classes = int(np.shape(fc)[0]) if fc is not None and np.ndim(fc) == 2 else 1000
  shapes = expected_shapes(depth, num_classes)
  variables: dict[str, dict] = {"params": {}, "batch_stats": {}}
  used, missing, filled = set(), [], set()
  for module, (kind, flax_module) in _modules(depth, num_classes).items():
    if kind == "bn":
      used.add(f"{module}.num_batches_tracked")      # a counter, not a weight: dropped
    for name, (path, transform) in _targets(kind, flax_module).items():
      key = f"{module}.{name}"
      if key not in state_dict:
        missing.append(key)
        continue
      used.add(key)
      value = transform(np.asarray(state_dict[key], np.float32))
      want = shapes.get(path)
      if want is None:
        raise RuntimeError(f"internal: no Flax variable {'/'.join(path)} for '{key}'")
      if value.shape != want:
        raise UserError(f"'{key}' has shape {tuple(np.shape(state_dict[key]))}: converted "
                        f"{value.shape} but ResNet-{depth} {'/'.join(path)} is {want}; is this "
                        f"a torchvision resnet{depth}?")
      _set(variables, path, np.ascontiguousarray(value))
      filled.add(path)
  if missing:
    raise UserError(f"the state dict lacks {_listed(missing)} of torchvision resnet{depth}; pass "
                    f"a whole resnet{depth} state_dict() or the --depth matching the weights")
  extra = sorted(set(state_dict) - used)
  if extra:
    raise UserError(f"the state dict has {_listed(extra)}, unknown to torchvision resnet{depth}; "
                    "pass --depth matching the weights")
  unfilled = sorted("/".join(p) for p in set(shapes) - filled)
  if unfilled:
    raise RuntimeError(f"internal: no torchvision weight fills {_listed(unfilled)}")
  return variables


def _why(e: Exception) -> str:
  """One line of an exception's message. torch's weights-only refusal runs to a paragraph; the
  first sentence after 'WeightsUnpickler error:' names what was refused."""
  text = str(e)
  m = re.search(r"WeightsUnpickler error: (.*?)(\.\s|\n|$)", text)
  line = m.group(1) if m else " ".join(text.split())
  return line if len(line) <= 200 else line[:200] + "..."


def _torch_state_dict(path: str) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError:
    print("pip install torch to convert; the converted .npz needs no torch", file=sys.stderr)
    sys.exit(2)
  try:
    # Tensors and plain containers only: unpickling anything else can run code of the file's
    # choosing (a __reduce__ that calls os.system), so a file that needs it is refused.
    loaded = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:
    if isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e):
      raise UserError(f"{path}: refused: it holds more than weights ({_why(e)}), and unpickling "
                      f"it could run code from the file; save the weights with "
                      f"torch.save(model.state_dict(), path)") from None
    if isinstance(e, TypeError) and "weights_only" in str(e):
      raise UserError(f"torch {getattr(torch, '__version__', '')} cannot load weights only; "
                      f"pip install 'torch>=1.13'") from None
    raise UserError(f"{path}: cannot torch.load it ({type(e).__name__}: {_why(e)})") from None
  for key in ("state_dict", "model"):
    if isinstance(loaded, Mapping) and isinstance(loaded.get(key), Mapping):
      loaded = loaded[key]
  if not isinstance(loaded, Mapping):
    raise UserError(f"{path}: holds a {type(loaded).__name__}, not a state dict; save "
                    "model.state_dict() with torch.save")
  return {k: v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
          for k, v in loaded.items()}


def _leaves(tree: Mapping) -> list[np.ndarray]:
  return [x for v in tree.values() for x in (_leaves(v) if isinstance(v, Mapping) else [v])]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m benchmarks.resnet.convert_torch",
      description="Converts torchvision ResNet weights (.pth state dict) to an .npz that "
                  "benchmarks.common.weights.load reads.")
  parser.add_argument("--depth", type=int, default=34, help="ResNet depth: 18, 34, 50, ...")
  parser.add_argument("input", help="torch.save'd state dict, e.g. resnet34.pth")
  parser.add_argument("output", help="the .npz to write")
  args = parser.parse_args(argv)
  try:
    variables = convert(_torch_state_dict(args.input), args.depth)
    weights.save_npz(variables, args.output)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  count = sum(v.size for c in variables.values() for v in _leaves(c))
  print(f"wrote {args.output}: ResNet-{args.depth} params and batch_stats, {count:,} numbers "
        f"from {args.input}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
