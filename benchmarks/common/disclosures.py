"""What MLPerf 6.1.0 asks every run to disclose (mlperf-logging's 6.1.0 `common.yaml`): the
lowest numerical precision in linear layers, attention and communication, the tensor, pipeline,
context and expert parallelism, the micro-batch and the config file. Read from the run's
config, mesh and layout; the language models log them (`benchmarks/lm`, `benchmarks/llama`)."""

from __future__ import annotations

import math

from logs.mlperf import C
from mesh.spec import parse_layout, parse_mesh

PRECISION = {"float32": "fp32", "bfloat16": "bfloat16", "float64": "fp64"}


def parallelism(cfg, num_devices: int, model_dims: tuple[str, ...]) -> dict[str, int]:
  """The ways the mesh and layout split the work: tensor parallelism is the number of devices
  the model dimensions are split over, context parallelism those of `length`, data those of
  `batch`."""
  mesh = parse_mesh(cfg.mesh).resolve(num_devices)
  layout = parse_layout(cfg.layout)
  sizes = dict(mesh.axes)

  def ways(dims):
    return math.prod(sizes[a] for a in {a for d in dims for a in layout.axes_for(d) if a in sizes})
  return {"tensor": ways(model_dims), "context": ways(("length",)), "data": ways(("batch",))}


def devices(cfg, shapes_only: bool) -> int:
  """The devices the run's mesh covers: this process's view, or (compile-only, where the devices
  are a TPU slice's and not jax.devices()) the mesh string's own size when it names every axis."""
  import jax
  spec = parse_mesh(cfg.mesh)
  return spec.size if shapes_only and -1 not in spec.shape else jax.device_count()


def keys(cfg, num_devices: int, model_dims: tuple[str, ...], micro_batch: int,
         config_filename: str) -> list[tuple]:
  """The disclosure keys as (key, value) pairs. Model-parallel layouts all-reduce activations
  in the compute dtype; gradients of the float32 (float64) parameters travel in the parameter
  dtype."""
  par = parallelism(cfg, num_devices, model_dims)
  linear = PRECISION[cfg.dtype]
  comm = linear if par["tensor"] > 1 or par["context"] > 1 else \
      PRECISION["float64" if cfg.dtype == "float64" else "float32"]
  return [
      (C.LOWEST_NUMERICAL_PRECISION_IN_LINEAR, linear),
      (C.LOWEST_NUMERICAL_PRECISION_IN_ATTN, linear),
      (C.LOWEST_NUMERICAL_PRECISION_IN_COMM, comm),
      (C.TENSOR_PARALLELISM, par["tensor"]),
      (C.PIPELINE_PARALLELISM, 1),
      (C.CONTEXT_PARALLELISM, par["context"]),
      (C.EXPERT_PARALLELISM, 1),
      (C.MICRO_BATCH_SIZE, micro_batch),
      (C.CONFIG_FILENAME, config_filename)]
