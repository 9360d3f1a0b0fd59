"""Helpers every model uses: named parameter initializers and dtypes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from mesh.errors import UserError

DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32, "float64": jnp.float64}


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
