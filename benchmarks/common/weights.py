"""ResNet weights for warm starts: one .npz file, or the latest orbax checkpoint of a run.

The variables are the Flax ones of `benchmarks.resnet.model.ResNet`:
{"params": {"stem": {"kernel"}, "BatchNorm_0": {"scale", "bias"}, "Block_0": {...}, ...,
"Dense_0": {"kernel", "bias"}}, "batch_stats": {"BatchNorm_0": {"mean", "var"}, ...}}.

- `save_npz(variables, path)` writes them as one .npz whose keys are the paths joined by "/",
  e.g. "params/Block_0/Conv_0/kernel" (what `convert_torch` writes from torchvision weights).
- `load(path)` reads such an .npz, or a training run's orbax checkpoint (the run's output_dir,
  its checkpoints/ folder or one step folder; the latest step is taken), as numpy arrays on the
  host: convolution kernels HWIO (a run of `--kernel_layout=OHWI` stores them OHWI), batch
  norm's scale and bias apart (a run of `--bn_stacked` keeps them as one (2, c) "scale_bias",
  one of `--bn_flat` as columns of one "batch_norms" for the whole model),
  running statistics one per channel (a run of `--bn_group_stats` keeps one per group:
  averaged). SSD's backbone loads ImageNet-pretrained ResNet-34 weights through it.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from runtime.errors import UserError

COLLECTIONS = ("params", "batch_stats")
# How a model stores its convolution kernels (`benchmarks.common.convnet`); files are HWIO.
KERNEL_LAYOUTS = ("HWIO", "OHWI")
_SOURCES = ("pass an .npz from `python -m benchmarks.resnet.convert_torch` or `save_npz`, or a "
            "training run's output_dir, its checkpoints/ folder or one step folder")


def _flatten(tree: Mapping, prefix: str, out: dict[str, np.ndarray]) -> None:
  for k, v in tree.items():
    if not isinstance(k, str) or not k or "/" in k:
      raise UserError(f"cannot save variable name {k!r} under {prefix!r}: names must be "
                      "non-empty strings without '/'")
    name = f"{prefix}/{k}"
    if isinstance(v, Mapping):
      _flatten(v, name, out)
    else:
      v = v.unbox() if hasattr(v, "unbox") else v      # flax LogicallyPartitioned boxes
      out[name] = np.asarray(v)


def _unflatten(flat: Mapping[str, np.ndarray], where: str) -> dict[str, Any]:
  tree: dict[str, Any] = {}
  for name, value in flat.items():
    *parents, leaf = name.split("/")
    node = tree
    for p in parents:
      node = node.setdefault(p, {})
      if not isinstance(node, dict):
        raise UserError(f"{where}: '{name}' lies under an array; not ResNet weights")
    if leaf in node:
      raise UserError(f"{where}: '{name}' is both an array and a group; not ResNet weights")
    node[leaf] = value
  return tree


HWIO_TO_OHWI = (3, 0, 1, 2)
_OHWI_TO_HWIO = (1, 2, 3, 0)


def _each_kernel(tree, perm):
  """`tree` (nested mappings) with every 4-D "kernel" leaf transposed by `perm`."""
  return {k: (_each_kernel(v, perm) if isinstance(v, Mapping) else
              v.transpose(perm) if k == "kernel" and getattr(v, "ndim", 0) == 4 else v)
          for k, v in tree.items()}


def to_hwio(params, layout: str):
  """Parameters stored in `layout` (KERNEL_LAYOUTS) with their convolution kernels in HWIO."""
  return params if layout == "HWIO" else _each_kernel(params, _OHWI_TO_HWIO)


def from_hwio(params, layout: str):
  """HWIO parameters (a weight file's, a checkpoint's) with their kernels stored in `layout`."""
  return params if layout == "HWIO" else _each_kernel(params, HWIO_TO_OHWI)


def split_batch_norms(params):
  """`params` (nested mappings) with every batch norm's (2, c) "scale_bias" (`--bn_stacked`,
  `convnet.BatchNorm.stacked`) as its "scale" and "bias", as weight files hold them."""
  out = {}
  for k, v in params.items():
    if isinstance(v, Mapping):
      out[k] = split_batch_norms(v)
    elif k == "scale_bias":
      out["scale"], out["bias"] = v[0], v[1]
    else:
      out[k] = v
  return out


def stack_batch_norms(params):
  """`split_batch_norms`' inverse: every mapping that holds exactly "scale" and "bias" (a batch
  norm's parameters; nothing else has a scale) as one (2, c) "scale_bias"."""
  if set(params) == {"scale", "bias"} and not isinstance(params["scale"], Mapping):
    return {"scale_bias": np.stack([np.asarray(params["scale"]), np.asarray(params["bias"])])}
  return {k: stack_batch_norms(v) if isinstance(v, Mapping) else v for k, v in params.items()}


def _batch_norm_paths(params) -> list[tuple[tuple[str, ...], int]]:
  """(path, channels) of a ResNet's batch norms in the order the model makes them (its flat
  parameter's columns, `ResNet.batch_norm_columns`): the stem's "BatchNorm_0", then each
  "Block_<i>"'s "BatchNorm_<k>", which normalizes the output of its "Conv_<k>" (HWIO kernels:
  the channels are the last dimension)."""
  index = lambda name: int(name.rsplit("_", 1)[1])                       # noqa: E731
  paths = [(("BatchNorm_0",), params["stem"]["kernel"].shape[-1])]
  for block in sorted((k for k in params if k.startswith("Block_")), key=index):
    convs = sorted((k for k in params[block] if k.startswith("Conv_")), key=index)
    paths += [((block, f"BatchNorm_{index(k)}"), params[block][k]["kernel"].shape[-1])
              for k in convs]
  return paths


def split_flat_batch_norms(params):
  """HWIO `params` with a ResNet's flat "batch_norms" parameter (`--bn_flat`) as each batch
  norm's own (2, c) "scale_bias"; others as they are."""
  if "batch_norms" not in params:
    return params
  out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in params.items()
         if k != "batch_norms"}
  flat, start = np.asarray(params["batch_norms"]), 0
  for path, c in _batch_norm_paths(params):
    node = out
    for key in path[:-1]:
      node = node[key]
    node[path[-1]] = {"scale_bias": flat[:, start:start + c]}
    start += c
  if start != flat.shape[1]:
    raise UserError(f"the flat batch-norm parameter has {flat.shape[1]} columns, but the "
                    f"model's convolutions give {start}: not a ResNet's weights of this harness")
  return out


def flatten_batch_norms(params):
  """`split_flat_batch_norms`' inverse: HWIO `params` with every (2, c) "scale_bias" of a
  ResNet's batch norms as columns of one "batch_norms"."""
  paths = _batch_norm_paths(params)
  out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in params.items()}
  columns = []
  for path, _ in paths:
    node = out
    for key in path[:-1]:
      node = node[key]
    columns.append(np.asarray(node.pop(path[-1])["scale_bias"]))
  return {**out, "batch_norms": np.concatenate(columns, axis=1)}


def check_kernel_layout(layout: str) -> None:
  if layout not in KERNEL_LAYOUTS:
    raise UserError(f"--kernel_layout={layout}: choose one of {', '.join(KERNEL_LAYOUTS)} "
                    "(OHWI for NVIDIA GPUs, HWIO elsewhere)")


def stem_layout(shape) -> str | None:
  """How a stem kernel of `shape` is stored: "HWIO" (7, 7, 3, width), "OHWI" (width, 7, 7, 3),
  None if neither."""
  shape = tuple(shape)
  if len(shape) == 4 and shape[2] == 3:
    return "HWIO"
  if len(shape) == 4 and shape[1:] == (7, 7, 3):
    return "OHWI"
  return None


def _check_resnet(variables: Mapping, where: str, hint: str = "") -> None:
  """Raises UserError unless `variables` look like this harness's ResNet variables."""
  hint = f" ({hint})" if hint else ""
  missing = [c for c in COLLECTIONS if not isinstance(variables.get(c), Mapping)]
  if missing:
    raise UserError(f"{where}: no {' or '.join(missing)} in it; not ResNet weights{hint}")
  params, stats = variables["params"], variables["batch_stats"]
  stem = params.get("stem")
  shape = getattr(stem.get("kernel"), "shape", None) if isinstance(stem, Mapping) else None
  if shape is None or stem_layout(shape) is None:
    raise UserError(f"{where}: no params/stem/kernel of shape (7, 7, 3, width); not weights of "
                    f"this harness's ResNet{hint}")
  if not isinstance(stats.get("BatchNorm_0"), Mapping) or "Block_0" not in params:
    raise UserError(f"{where}: no batch_stats/BatchNorm_0 or params/Block_0; not weights of this "
                    f"harness's ResNet{hint}")


def save_npz(variables: Mapping, path: str) -> None:
  """Writes {"params", "batch_stats"} (nested dicts of arrays) to one .npz, atomically."""
  extra = sorted(set(variables) - set(COLLECTIONS))
  if extra:
    raise UserError(f"save_npz saves only {' and '.join(COLLECTIONS)}; got also {extra}")
  flat: dict[str, np.ndarray] = {}
  for c in COLLECTIONS:
    if isinstance(variables.get(c), Mapping):
      _flatten(variables[c], c, flat)
  _check_resnet(_unflatten(flat, "save_npz"), "save_npz")
  path = os.path.abspath(os.path.expanduser(path))
  folder = os.path.dirname(path)
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)
  try:
    with os.fdopen(fd, "wb") as f:    # a file object: np.savez adds no ".npz" to the name
      np.savez(f, **flat)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def _load_npz(path: str) -> dict[str, Any]:
  hint = ("; a torchvision .pth needs converting first: python -m benchmarks.resnet.convert_torch"
          if path.endswith((".pth", ".pt")) else f"; {_SOURCES}")
  try:
    with open(path, "rb") as f:
      if f.read(2) != b"PK":
        raise UserError(f"{path}: not an .npz file (not a zip archive){hint}")
    with np.load(path, allow_pickle=False) as npz:        # a zip: always an NpzFile
      flat = {k: npz[k] for k in npz.files}
  except UserError:
    raise
  except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:
    raise UserError(f"{path}: not an .npz file of arrays ({type(e).__name__}: {e}){hint}") from None
  bad = [k for k in flat if k.split("/", 1)[0] not in COLLECTIONS or "/" not in k]
  if bad:
    raise UserError(f"{path}: key '{bad[0]}' is not params/... or batch_stats/...; not ResNet "
                    f"weights{hint}")
  return _unflatten(flat, path)


def _item_dir(path: str) -> str:
  """The orbax item folder (<step>/default) of the latest step under `path`."""
  import orbax.checkpoint as ocp
  is_item = lambda p: os.path.isfile(os.path.join(p, "_METADATA"))
  if os.path.isdir(os.path.join(path, "checkpoints")):
    path = os.path.join(path, "checkpoints")
  if is_item(path):
    return path
  if is_item(os.path.join(path, "default")):
    return os.path.join(path, "default")
  steps = ocp.utils.checkpoint_steps_paths(path)
  if not steps:
    raise UserError(f"{path}: no finished orbax checkpoint step in this folder; {_SOURCES}")
  latest = max(steps, key=lambda p: ocp.utils.step_from_checkpoint_name(p.name))
  if not is_item(os.path.join(str(latest), "default")):
    raise UserError(f"{latest}: no default/ item; not a checkpoint of this harness's training "
                    "loop (harness/train.py)")
  return os.path.join(str(latest), "default")


def _each_leaf(fn, tree):
  """`tree` (nested mappings) with `fn` applied to each leaf."""
  if isinstance(tree, Mapping):
    return {k: _each_leaf(fn, v) for k, v in tree.items()}
  return fn(tree)


def _load_orbax(path: str) -> dict[str, Any]:
  """Only params and model_state of the saved train state, as numpy arrays on the host."""
  import orbax.checkpoint as ocp
  from etils import epath
  item_dir = _item_dir(path)
  handler = ocp.PyTreeCheckpointHandler()
  try:
    try:
      tree = handler.metadata(epath.Path(item_dir)).tree
    except Exception as e:
      raise UserError(f"{item_dir}: cannot read the orbax checkpoint's metadata "
                      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not (isinstance(tree, Mapping) and isinstance(tree.get("params"), Mapping)
            and isinstance(tree.get("model_state"), Mapping)):
      raise UserError(f"{item_dir}: no params and model_state in the checkpoint; not a train "
                      "state saved by harness/train.py")
    stats = tree["model_state"].get("batch_stats")
    _check_resnet({"params": tree["params"], "batch_stats": stats}, item_dir, _SOURCES)
    item = {"params": tree["params"], "model_state": {"batch_stats": stats}}
    restore_args = _each_leaf(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    try:
      out = handler.restore(epath.Path(item_dir), args=ocp.args.PyTreeRestore(
          item=item, restore_args=restore_args, partial_restore=True))
    except Exception as e:
      raise UserError(f"{item_dir}: cannot restore the orbax checkpoint "
                      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
  finally:
    handler.close()
  return {"params": out["params"], "batch_stats": out["model_state"]["batch_stats"]}


def _check_npz(path: str, where: str) -> set[str]:
  """The names under params/ of an .npz of ResNet weights, checked without reading its arrays
  (the stem kernel's shape comes from its .npy header)."""
  hint = f"; {_SOURCES}"
  try:
    with open(path, "rb") as f:
      if f.read(2) != b"PK":
        raise UserError(f"{where}: not an .npz file (not a zip archive){hint}")
    with zipfile.ZipFile(path) as z:
      names = [n[:-4] for n in z.namelist() if n.endswith(".npy")]
      stem = "params/stem/kernel"
      if stem not in names:
        raise UserError(f"{where}: no {stem} in it; not ResNet weights{hint}")
      with z.open(stem + ".npy") as f:
        major, _ = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if major == 1 else
                       np.lib.format.read_array_header_2_0)
        shape = read_header(f)[0]
  except UserError:
    raise
  except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:
    raise UserError(f"{where}: not an .npz file of arrays ({type(e).__name__}: {e}){hint}"
                    ) from None
  bad = [k for k in names if k.split("/", 1)[0] not in COLLECTIONS or "/" not in k]
  if bad:
    raise UserError(f"{where}: key '{bad[0]}' is not params/... or batch_stats/...; not ResNet "
                    f"weights{hint}")
  if stem_layout(shape) is None:
    raise UserError(f"{where}: params/stem/kernel has shape {shape}, not (7, 7, 3, width); not "
                    f"weights of this harness's ResNet{hint}")
  found = {k.split("/")[1] for k in names if k.startswith("params/")}
  # A --bn_flat run's batch norms are columns of "batch_norms"; `load` gives the stem's its
  # own "BatchNorm_0" (`split_flat_batch_norms`).
  return found | {"BatchNorm_0"} if "batch_norms" in found else found


def _has_item(path: str) -> bool:
  """An orbax checkpoint item (or step folder) this harness's loop wrote is under `path`."""
  def is_item(p):
    return os.path.isfile(os.path.join(p, "_METADATA"))
  if os.path.isdir(os.path.join(path, "checkpoints")):
    path = os.path.join(path, "checkpoints")
  if is_item(path) or is_item(os.path.join(path, "default")):
    return True
  return any(n.isdigit() and is_item(os.path.join(path, n, "default")) for n in os.listdir(path))


def check(path: str, where: str) -> set[str] | None:
  """Cheap checks that `load(path)` finds ResNet weights there, nothing loaded: the path exists;
  an .npz holds params/ and batch_stats/ arrays and a stem kernel of 3 input channels (returns
  the names under params/); a folder holds an orbax checkpoint item (returns None: its names
  are read when it is loaded). `where` names the flag in the errors."""
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.exists(path):
    raise UserError(f"{where}: {path} does not exist; {_SOURCES}")
  if os.path.isdir(path):
    try:
      found = _has_item(path)
    except OSError as e:
      raise UserError(f"{where}: cannot read {path} ({e.strerror}); {_SOURCES}") from None
    if not found:
      raise UserError(f"{where}: no orbax checkpoint in {path} (no _METADATA in it, its "
                      f"checkpoints/ folder or a step folder's default/); {_SOURCES}")
    return None
  return _check_npz(path, where)


def load(path: str) -> dict[str, Any]:
  """{"params", "batch_stats"} as nested dicts of numpy arrays, from an .npz written by
  `save_npz` or from the latest orbax checkpoint under a run's output_dir, its checkpoints/
  folder, or one step folder."""
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.exists(path):
    raise UserError(f"{path} does not exist; {_SOURCES}")
  variables = _load_orbax(path) if os.path.isdir(path) else _load_npz(path)
  _check_resnet(variables, path, _SOURCES)
  # A run of --bn_group_stats kept each group's running statistics, (groups, channels): their
  # average, as its evaluation takes it.
  variables = {**variables, "batch_stats": _each_leaf(
      lambda v: v.mean(0) if v.ndim == 2 else v, variables["batch_stats"])}
  if stem_layout(variables["params"]["stem"]["kernel"].shape) == "OHWI":
    # A run that stored its kernels OHWI (--kernel_layout=OHWI): HWIO, as every file here is.
    variables = {**variables, "params": to_hwio(variables["params"], "OHWI")}
  # A run of --bn_flat and --bn_stacked: each batch norm's scale and bias apart.
  return {**variables,
          "params": split_batch_norms(split_flat_batch_norms(variables["params"]))}
