"""ResNet warm-start weights: the torchvision converter against an independent numpy forward of
torchvision's ResNet (NCHW/OIHW, straight from the state dict), and `weights.save_npz`/`load`
on .npz files and on orbax checkpoints written by the training loop."""

from __future__ import annotations

import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec
from numpy.lib.stride_tricks import sliding_window_view

from benchmarks.common import weights
from benchmarks.common.weights import from_hwio
from benchmarks.resnet import convert_torch
from benchmarks.resnet.convert_torch import convert
from benchmarks.resnet.model import ResNet
from harness.checkpoints import Checkpoints
from runtime.errors import UserError

TORCHVISION = {18: ((2, 2, 2, 2), False), 34: ((3, 4, 6, 3), False), 50: ((3, 4, 6, 3), True)}


# --- torchvision's ResNet in numpy, written from torchvision/models/resnet.py -----------------

def torchvision_state_dict(depth: int, seed: int = 0, classes: int = 1000) -> dict:
  """Every key torchvision's resnet{depth}().state_dict() has, random and well scaled (He)."""
  rng = np.random.default_rng(seed)
  sd: dict[str, np.ndarray] = {}

  def conv(name, out, inp, k):
    sd[f"{name}.weight"] = rng.normal(0, np.sqrt(2 / (inp * k * k)), (out, inp, k, k))

  def bn(name, c, last=False):
    sd[f"{name}.weight"] = rng.uniform(0.2, 0.5, c) if last else rng.uniform(0.7, 1.3, c)
    sd[f"{name}.bias"] = rng.normal(0, 0.1, c)
    sd[f"{name}.running_mean"] = rng.normal(0, 0.1, c)
    sd[f"{name}.running_var"] = rng.uniform(0.5, 2.0, c)
    sd[f"{name}.num_batches_tracked"] = np.array(1000, np.int64)

  conv("conv1", 64, 3, 7)
  bn("bn1", 64)
  blocks, bottleneck = TORCHVISION[depth]
  expansion, inplanes = (4 if bottleneck else 1), 64
  for layer, n in enumerate(blocks):
    planes = 64 * 2**layer
    for b in range(n):
      p, stride = f"layer{layer + 1}.{b}", (2 if layer > 0 and b == 0 else 1)
      if bottleneck:
        conv(f"{p}.conv1", planes, inplanes, 1)
        conv(f"{p}.conv2", planes, planes, 3)
        conv(f"{p}.conv3", planes * 4, planes, 1)
        bn(f"{p}.bn1", planes), bn(f"{p}.bn2", planes), bn(f"{p}.bn3", planes * 4, last=True)
      else:
        conv(f"{p}.conv1", planes, inplanes, 3)
        conv(f"{p}.conv2", planes, planes, 3)
        bn(f"{p}.bn1", planes), bn(f"{p}.bn2", planes, last=True)
      if stride != 1 or inplanes != planes * expansion:
        conv(f"{p}.downsample.0", planes * expansion, inplanes, 1)
        bn(f"{p}.downsample.1", planes * expansion)
      inplanes = planes * expansion
  sd["fc.weight"] = rng.normal(0, 1 / np.sqrt(inplanes), (classes, inplanes))
  sd["fc.bias"] = rng.normal(0, 0.1, classes)
  return {k: v if v.dtype == np.int64 else v.astype(np.float32) for k, v in sd.items()}


def _conv(x, w, stride, pad):
  """torch.nn.functional.conv2d: x (N, C, H, W), w (O, C, kh, kw), zero padding on both sides."""
  x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  windows = sliding_window_view(x, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
  return np.einsum("nchwij,ocij->nohw", windows, w, optimize=True)


def _bn(x, sd, name):
  v = lambda k: sd[f"{name}.{k}"].astype(np.float64)[None, :, None, None]
  return (x - v("running_mean")) / np.sqrt(v("running_var") + 1e-5) * v("weight") + v("bias")


def _max_pool(x):
  """MaxPool2d(3, stride=2, padding=1): padding never wins (-inf)."""
  x = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
  return sliding_window_view(x, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(4, 5))


def torchvision_forward(sd: dict, x: np.ndarray, depth: int) -> np.ndarray:
  """Eval-mode logits of torchvision's resnet{depth} on NCHW `x`, in float64."""
  w = lambda k: sd[k].astype(np.float64)
  relu = lambda v: np.maximum(v, 0)
  x = relu(_bn(_conv(x.astype(np.float64), w("conv1.weight"), 2, 3), sd, "bn1"))
  x = _max_pool(x)
  blocks, bottleneck = TORCHVISION[depth]
  for layer, n in enumerate(blocks):
    for b in range(n):
      p, stride = f"layer{layer + 1}.{b}", (2 if layer > 0 and b == 0 else 1)
      if bottleneck:     # v1.5: the stride is on conv2 (3x3)
        y = relu(_bn(_conv(x, w(f"{p}.conv1.weight"), 1, 0), sd, f"{p}.bn1"))
        y = relu(_bn(_conv(y, w(f"{p}.conv2.weight"), stride, 1), sd, f"{p}.bn2"))
        y = _bn(_conv(y, w(f"{p}.conv3.weight"), 1, 0), sd, f"{p}.bn3")
      else:
        y = relu(_bn(_conv(x, w(f"{p}.conv1.weight"), stride, 1), sd, f"{p}.bn1"))
        y = _bn(_conv(y, w(f"{p}.conv2.weight"), 1, 1), sd, f"{p}.bn2")
      identity = x
      if f"{p}.downsample.0.weight" in sd:
        identity = _bn(_conv(x, w(f"{p}.downsample.0.weight"), stride, 0), sd, f"{p}.downsample.1")
      x = relu(y + identity)
  x = x.mean(axis=(2, 3))                          # AdaptiveAvgPool2d((1, 1)) + flatten
  return x @ w("fc.weight").T + w("fc.bias")


# --- the converter ------------------------------------------------------------------------------

_apply = jax.jit(lambda variables, x: ResNet(34, 64, 1000).apply(variables, x, train=False))


def test_converted_resnet34_matches_torchvision_forward():
  sd = torchvision_state_dict(34)
  variables = convert(sd, 34)
  x = np.random.default_rng(1).standard_normal((2, 32, 32, 3)).astype(np.float32)
  want = torchvision_forward(sd, x.transpose(0, 3, 1, 2), 34)
  scale = np.abs(want).max()
  assert 0.3 < scale < 30 and want.std() > 0.1 * scale, (scale, want.std())   # O(1), varied
  got = np.asarray(_apply(variables, x))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
  # The check has teeth: the stem kernel with height and width swapped is far off.
  wrong = jax.tree.map(lambda a: a, variables)
  wrong["params"]["stem"]["kernel"] = variables["params"]["stem"]["kernel"].transpose(1, 0, 2, 3)
  assert np.abs(np.asarray(_apply(wrong, x)) - want).max() > 100 * 1e-4 * scale


def _flax_shapes(depth, width=64, classes=1000):
  model = ResNet(depth, width, classes)
  return jax.eval_shape(lambda r: nn.meta.unbox(model.init(
      r, jnp.zeros((1, 32, 32, 3), jnp.float32), train=False)), jax.random.PRNGKey(0))


@pytest.mark.parametrize("depth", [18, 34, 50])
def test_convert_fills_every_variable_with_its_shape(depth):
  variables = convert(torchvision_state_dict(depth, classes=10), depth)
  shapes = _flax_shapes(depth, classes=10)
  assert jax.tree.structure(variables) == jax.tree.structure(shapes)
  assert jax.tree.map(np.shape, variables) == jax.tree.map(lambda s: s.shape, shapes)
  assert all(a.dtype == np.float32 for a in jax.tree.leaves(variables))


def test_convert_maps_torchvision_names():
  sd = torchvision_state_dict(50, classes=10)
  v = convert(sd, 50)
  p, s = v["params"], v["batch_stats"]
  np.testing.assert_array_equal(p["stem"]["kernel"], sd["conv1.weight"].transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(p["Dense_0"]["kernel"], sd["fc.weight"].T)
  # Block_3 is layer2.0; in a bottleneck block conv3 is Conv_2 and the projection Conv_3.
  np.testing.assert_array_equal(p["Block_3"]["Conv_2"]["kernel"][0, 0],
                                sd["layer2.0.conv3.weight"][:, :, 0, 0].T)
  np.testing.assert_array_equal(p["Block_3"]["Conv_3"]["kernel"][0, 0],
                                sd["layer2.0.downsample.0.weight"][:, :, 0, 0].T)
  np.testing.assert_array_equal(s["Block_3"]["BatchNorm_3"]["var"],
                                sd["layer2.0.downsample.1.running_var"])
  np.testing.assert_array_equal(p["Block_15"]["BatchNorm_2"]["scale"], sd["layer4.2.bn3.weight"])


def test_convert_accepts_no_counters_and_a_dataparallel_prefix():
  sd = torchvision_state_dict(18, classes=10)
  want = convert(sd, 18)
  bare = {k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")}
  prefixed = {f"module.{k}": v for k, v in sd.items()}
  for other in (convert(bare, 18), convert(prefixed, 18)):
    jax.tree.map(np.testing.assert_array_equal, other, want)


@pytest.mark.parametrize("edit, message", [
    (lambda sd: sd.pop("layer2.0.downsample.1.running_var"), "layer2.0.downsample.1.running_var"),
    (lambda sd: sd.pop("fc.bias"), "fc.bias"),
    (lambda sd: sd.update({"layer4.3.conv1.weight": np.zeros((512, 512, 3, 3))}),
     "layer4.3.conv1.weight"),
    (lambda sd: sd.update({"layer1.0.bn3.num_batches_tracked": np.array(0)}),
     "layer1.0.bn3.num_batches_tracked"),
    (lambda sd: sd.update({"layer1.0.conv1.weight": np.zeros((64, 64, 1, 1))}),
     "layer1.0.conv1.weight"),
], ids=["missing-bn-stat", "missing-fc-bias", "extra-block", "extra-counter", "wrong-shape"])
def test_convert_names_a_missing_extra_or_misshapen_key(edit, message):
  sd = torchvision_state_dict(34, classes=10)
  edit(sd)
  with pytest.raises(UserError, match=message.replace(".", r"\.")):
    convert(sd, 34)


def test_convert_rejects_the_wrong_depth():
  sd = torchvision_state_dict(34, classes=10)
  with pytest.raises(UserError, match=r"layer1\.2\..*resnet18"):
    convert(sd, 18)                       # ResNet-34 has more blocks: extra keys
  with pytest.raises(UserError, match="resnet50"):
    convert(sd, 50)
  with pytest.raises(UserError, match="depths"):
    convert(sd, 33)


class _Tensor:
  """What main() needs of a torch tensor."""
  def __init__(self, a):
    self.a = a

  def detach(self):
    return self

  def cpu(self):
    return self

  def numpy(self):
    return self.a


def test_main_converts_a_torch_file(tmp_path, monkeypatch, capsys):
  sd = torchvision_state_dict(18, classes=10)

  def fake_load(path, map_location, weights_only=False):
    assert weights_only is True              # never unpickle code from a downloaded file
    return {"state_dict": {k: _Tensor(v) for k, v in sd.items()}}
  fake_torch = types.SimpleNamespace(
      load=fake_load,
      nn=types.SimpleNamespace(Module=type("Module", (), {})))
  monkeypatch.setitem(sys.modules, "torch", fake_torch)
  out = tmp_path / "resnet18.npz"
  assert convert_torch.main(["--depth=18", "resnet18.pth", str(out)]) == 0
  assert f"wrote {out}" in capsys.readouterr().out
  jax.tree.map(np.testing.assert_array_equal, weights.load(str(out)), convert(sd, 18))


def test_main_without_torch_says_how_to_get_it(tmp_path, monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, "torch", None)        # import torch raises ImportError
  with pytest.raises(SystemExit) as e:
    convert_torch.main(["--depth=34", "resnet34.pth", str(tmp_path / "out.npz")])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "pip install torch to convert; the converted .npz needs no torch" in err
  assert not (tmp_path / "out.npz").exists()


# --- weights.save_npz / load --------------------------------------------------------------------

def _flat(variables):
  return {jax.tree_util.keystr(p): a for p, a in jax.tree_util.tree_flatten_with_path(variables)[0]}


def test_npz_round_trip(tmp_path):
  variables = convert(torchvision_state_dict(18, classes=10), 18)
  path = tmp_path / "sub" / "resnet18.npz"
  weights.save_npz(variables, str(path))
  assert os.listdir(path.parent) == ["resnet18.npz"]          # no temporary file left
  with np.load(path) as npz:
    assert "params/Block_0/Conv_0/kernel" in npz.files
    assert "batch_stats/BatchNorm_0/var" in npz.files
  loaded = weights.load(str(path))
  want, got = _flat(variables), _flat(loaded)
  assert got.keys() == want.keys()
  for k, a in want.items():
    assert got[k].dtype == a.dtype and isinstance(got[k], np.ndarray), k
    np.testing.assert_array_equal(got[k], a, err_msg=k)


def test_kernels_stored_ohwi_load_as_hwio(tmp_path):
  """A run of --kernel_layout=OHWI stores its kernels (out, h, w, in); weight files are read
  back HWIO, as torchvision's conversion writes them."""
  variables = convert(torchvision_state_dict(18, classes=10), 18)
  ohwi = {**variables, "params": from_hwio(variables["params"], "OHWI")}
  assert ohwi["params"]["stem"]["kernel"].shape == (64, 7, 7, 3)
  weights.save_npz(ohwi, str(tmp_path / "ohwi.npz"))
  want, got = _flat(variables), _flat(weights.load(str(tmp_path / "ohwi.npz")))
  assert got.keys() == want.keys()
  for k, a in want.items():
    np.testing.assert_array_equal(got[k], a, err_msg=k)


def test_gpu_preset_batch_norms_load_apart(tmp_path):
  """A run of the GPU preset stores its kernels OHWI and every batch norm's scale and bias as
  columns of one "batch_norms" (--bn_stacked --bn_flat); weight files are read back HWIO with
  each batch norm's scale and bias apart, and the cheap check finds the stem's batch norm."""
  variables = convert(torchvision_state_dict(18, classes=10), 18)
  flat = weights.flatten_batch_norms(weights.stack_batch_norms(variables["params"]))
  assert "BatchNorm_0" not in flat and "BatchNorm_1" not in flat["Block_0"]
  stored = {**variables, "params": from_hwio(flat, "OHWI")}
  weights.save_npz(stored, str(tmp_path / "gpu.npz"))
  assert {"BatchNorm_0", "batch_norms", "Block_0"} <= weights.check(str(tmp_path / "gpu.npz"), "x")
  want, got = _flat(variables), _flat(weights.load(str(tmp_path / "gpu.npz")))
  assert got.keys() == want.keys()
  for k, a in want.items():
    np.testing.assert_array_equal(got[k], a, err_msg=k)


def _small_state(offset: float):
  """A train state like harness/step.py's, of a ResNet-10 of width 8 (one array sharded)."""
  shapes = _flax_shapes(10, width=8, classes=16)
  rng = np.random.default_rng(0)
  variables = jax.tree.map(
      lambda s: jnp.asarray(rng.standard_normal(s.shape).astype(np.float32) + offset), shapes)
  params = dict(variables["params"])
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  params["Dense_0"] = dict(params["Dense_0"], kernel=jax.device_put(
      params["Dense_0"]["kernel"], NamedSharding(mesh, PartitionSpec(None, "data"))))
  return {"step": jnp.array(5, jnp.int32), "rng": jax.random.PRNGKey(1), "params": params,
          "model_state": {"batch_stats": variables["batch_stats"]},
          "opt_state": optax.sgd(0.1, momentum=0.9).init(params)}


def test_load_from_training_checkpoints(tmp_path):
  ckpt = Checkpoints(str(tmp_path / "checkpoints"))
  old, new = _small_state(0.0), _small_state(1.0)
  try:
    ckpt.save(old, 1, {})
    ckpt.save(new, 2, {})
  finally:
    ckpt.close()
  want_new = _flat({"params": new["params"], "batch_stats": new["model_state"]["batch_stats"]})
  want_old = _flat({"params": old["params"], "batch_stats": old["model_state"]["batch_stats"]})
  for path, want in [(tmp_path, want_new), (tmp_path / "checkpoints", want_new),
                     (tmp_path / "checkpoints" / "1", want_old),
                     (tmp_path / "checkpoints" / "1" / "default", want_old)]:
    got = _flat(weights.load(str(path)))
    assert got.keys() == want.keys(), path
    for k, a in want.items():
      assert isinstance(got[k], np.ndarray), (path, k, type(got[k]))
      np.testing.assert_array_equal(got[k], np.asarray(a), err_msg=f"{path} {k}")


def test_load_rejects_what_is_not_resnet_weights(tmp_path):
  (tmp_path / "empty").mkdir()
  (tmp_path / "notes.txt").write_text("hello")
  np.savez(tmp_path / "other.npz", x=np.zeros(3))
  np.savez(tmp_path / "bert.npz", **{"params/encoder/kernel": np.zeros((3, 3))})
  with open(tmp_path / "resnet34.pth", "wb") as f:               # a zip, like torch.save's
    np.savez(f, **{"archive/data.pkl": np.zeros(3)})
  ckpt = Checkpoints(str(tmp_path / "transformer" / "checkpoints"))
  try:
    ckpt.save({"step": jnp.array(1), "params": {"embed": {"embedding": jnp.ones((4, 2))}},
               "model_state": {}, "opt_state": {}}, 1, {})
  finally:
    ckpt.close()
  cases = [("missing.npz", "does not exist"), ("transformer", "no batch_stats"),
           ("empty", "no finished orbax checkpoint"), ("notes.txt", "not an .npz file"),
           ("other.npz", "key 'x'"), ("bert.npz", "no batch_stats"),
           ("resnet34.pth", "convert_torch")]
  for name, message in cases:
    with pytest.raises(UserError, match=message) as e:
      weights.load(str(tmp_path / name))
    assert "\n" not in str(e.value), name
  with pytest.raises(UserError, match="params/stem/kernel"):
    weights.save_npz({"params": {"embed": np.zeros(3)},
                      "batch_stats": {"BatchNorm_0": {"mean": np.zeros(3)}}}, str(tmp_path / "x"))
  assert not (tmp_path / "x").exists()
