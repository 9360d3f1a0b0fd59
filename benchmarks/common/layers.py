"""Helpers every model uses: named parameter initializers, dtypes, and rematerialization."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from runtime.errors import UserError

DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32, "float64": jnp.float64}
# ImageNet's channel means and deviations (RGB, on 0..255; torchvision's `Normalize` values),
# which the ResNet and SSD backbones expect: images leave the host as uint8 and are normalized
# in the compiled step.
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def normalize_imagenet(image, dtype):
  """uint8 RGB pixels as a backbone takes them: (x - mean) / std per channel, in `dtype`."""
  return ((image.astype(dtype) - jnp.asarray(IMAGENET_MEAN, dtype))
          / jnp.asarray(IMAGENET_STD, dtype))


def named_init(init, names):
  """An initializer whose parameter carries its dimension names (for the layout)."""
  return nn.with_logical_partitioning(init, names)


def param_dtype(dtype):
  """float32 parameters and statistics (also under bfloat16), except float64 for float64
  exactness checks."""
  return jnp.float64 if dtype == jnp.float64 else jnp.float32


def compute_dtype(name: str):
  """The jnp dtype of a config's `dtype` field (float64 needs 64-bit jax)."""
  if name == "float64" and not jax.config.jax_enable_x64:
    raise UserError("--dtype=float64 needs 64-bit jax: set JAX_ENABLE_X64=1")
  return DTYPES[name]


def dropout_key(rng, generator: str):
  """The key a model's dropout layers draw from (flax's "dropout" stream), from the step's raw
  threefry key `rng`, uint32[2] (`--dropout_rng`, benchmarks.config.DROPOUT_RNG): `rng`
  itself, or for "rbg" a jax "rbg" key made of `rng`'s two threefry halves, whose bits XLA's
  RngBitGenerator draws."""
  if generator == "threefry":
    return rng
  return jax.random.wrap_key_data(jax.random.split(rng).reshape(4), impl="rbg")


# Under an rbg key, dropout draws 16-bit words: the masks' bits are written to HBM by XLA's
# RngBitGenerator and read back by the kernels that apply them (forward and backward), so their
# width is traffic; 16 bits resolve a rate in steps of 2^-16 (0.1 -> 6554 / 65536 = 0.100006).
MASK_BITS = 16


class Dropout(nn.Module):
  """flax's `nn.Dropout` (the same "dropout" stream, and the same masks under a threefry key:
  `jax.random.bernoulli` with the kept inputs scaled by 1 / (1 - rate)). Under an rbg key
  (`dropout_key`) an input is dropped where a MASK_BITS-bit word falls below round(rate x
  2^MASK_BITS), and the kept ones are scaled by the inverse of that word's keep probability.
  `swap_last_axes`: under an rbg key, the words are drawn for `x`'s shape with its last two axes
  swapped, then swapped back: the same independent words, in the order a layout that puts the
  second-to-last axis minor keeps them, so RngBitGenerator's row-major output needs no relayout
  copy before it is read (the attention weights (batch, heads, queries, keys): the TPU compiler
  lays them out with the queries minor)."""
  rate: float
  swap_last_axes: bool = False

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return x
    if self.rate == 1.0:
      return jnp.zeros_like(x)
    rng = self.make_rng("dropout")
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) and str(jax.random.key_impl(rng)) == "rbg":
      cut = round(self.rate * 2 ** MASK_BITS)
      words = jnp.dtype(f"uint{MASK_BITS}")
      if self.swap_last_axes and x.ndim >= 2:
        bits = jax.random.bits(rng, x.shape[:-2] + (x.shape[-1], x.shape[-2]), words)
        keep = jnp.swapaxes(bits, -1, -2) >= cut
      else:
        keep = jax.random.bits(rng, x.shape, words) >= cut
      kept = 1.0 - cut / 2 ** MASK_BITS
    else:
      kept = 1.0 - self.rate
      keep = jax.random.bernoulli(rng, p=kept, shape=x.shape)
    return jax.lax.select(keep, x / kept, jnp.zeros_like(x))


# Rematerialization (`--remat`): each model marks its layers' outputs with `layer_output`; a
# loss wrapped by `remat` keeps, for the backward pass, only those (full), or those and every
# matmul's output (dots), and recomputes the rest, one layer at a time (`jax.checkpoint` with a
# policy of names: https://docs.jax.dev/en/latest/gradient-checkpointing.html). Unwrapped, the
# marks change nothing in the compiled program.
LAYER = "layer"


def layer_output(x):
  """A layer's output, named for `remat`'s policies."""
  return checkpoint_name(x, LAYER)


def remat_layer(module, mode: str):
  """A flax module class (one layer of a scanned stack) recomputed in the backward pass as
  `mode` says. A scan's backward pass needs its per-iteration residuals stacked over all
  iterations, so `remat` around a loss that scans its layers recomputes the whole forward and
  still keeps every layer's activations; a scanned model wraps its layer with this instead
  (flax's `nn.remat` inside `nn.scan`, as MaxText's scanned decoder layers), and its task says
  so (`Task.remat_in_model`). "full": the layer keeps only its input (the scan's carry);
  "dots": also its matmuls' outputs."""
  if mode == "none":
    return module
  policies = jax.checkpoint_policies
  policy = {"full": policies.nothing_saveable, "dots": policies.dots_saveable}[mode]
  return nn.remat(module, policy=policy, prevent_cse=False)


def remat(loss, mode: str):
  """`loss` recomputing its activations in the backward pass as `mode` says ("none": as is)."""
  if mode == "none":
    return loss
  policies = jax.checkpoint_policies
  layers = policies.save_only_these_names(LAYER)
  policy = {"full": layers,
            "dots": policies.save_from_both_policies(layers, policies.dots_saveable)}[mode]
  return jax.checkpoint(loss, policy=policy)
