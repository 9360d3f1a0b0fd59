"""SSD-ResNet34 (COCO) hyperparameters and presets (no jax import here)."""

from __future__ import annotations

import dataclasses

from benchmarks.common import weights
from benchmarks.common.stages import STAGES
from benchmarks.config import (
  Common,
  check_pool_backward,
  check_relu_backward,
  fraction,
  non_negative,
  positive,
  require,
)
from benchmarks.ssd.feature_maps import feature_sizes
from benchmarks.task import Spec
from runtime.errors import UserError
from stepmodel.accelerators import GPU_XLA_FLAGS

SPEC = Spec(mlperf_name="ssd", rulesets=("0.7.0", "1.0.0"), metric="mAP@[.5:.95]",
            target_field="target_map", mlperf_dataset="coco")
DATASETS = ("coco", "shapes")
DEPTHS = (10, 18, 34)   # ResNet backbones with basic blocks (10: tests)


@dataclasses.dataclass(frozen=True)
class Config(Common):
  # Data.
  dataset: str = "coco"
  image_size: int = 300
  num_classes: int = 81             # categories + background
  shapes_train: int = 3000          # --dataset=shapes: images written on first use
  shapes_eval: int = 300
  crop_trials: int = 1              # IoU-constrained crop attempts per image (MLPerf max_samples)
  # Model: ResNet backbone (conv5 removed, no downsampling in conv4_1), extra blocks, heads.
  backbone_depth: int = 34
  backbone_width: int = 64          # channels of conv2_x (64 in ResNet-34)
  backbone_checkpoint: str = ""     # ResNet weights (.npz from convert_torch, or a resnet run)
  extra_blocks: tuple[int, ...] = (2, 2, 2, 0, 0)   # per extra map: 2 = 3x3 stride 2, 0 = unpadded
  anchor_steps: tuple[int, ...] = (8, 16, 32, 64, 100, 300)
  anchor_scales: tuple[int, ...] = (21, 45, 99, 153, 207, 261, 315)  # pixels; maps + 1
  aspect_ratios: tuple[tuple[int, ...], ...] = ((2,), (2, 3), (2, 3), (2, 3), (2,), (2,))  # per map
  bn_span: int = 0                  # examples per batch-norm group; 0: the per-replica batch
  kernel_layout: str = "HWIO"       # convolution kernels stored HWIO, or OHWI (cuDNN's: GPUs)
  bn_group_stats: bool = False      # running statistics kept per batch-norm group (GPUs)
  pool_backward: str = "xla"        # the stem pool's backward: xla, or index (GPUs)
  bn_stacked: bool = False          # batch norm as one (2, c) scale and bias, stacked sums (GPUs)
  relu_backward: str = "output"     # a block's last ReLU's backward: output, or mask (GPUs)
  # Loss and detection.
  match_iou: float = 0.5
  negative_ratio: int = 3
  nms_iou: float = 0.5
  min_score: float = 0.05
  max_detections: int = 200         # per image, after NMS over all classes
  nms_candidates: int = 200         # best boxes per class that enter NMS
  # Optimizer: SGD with momentum, linear warmup, x0.1 at the decay boundaries.
  base_learning_rate: float = 2.5e-3   # per 32 images; the run uses base * batch / 32
  warmup_steps: int = 0
  warmup_factor: float = 0.0
  decay_epochs: tuple[int, ...] = (40, 50)
  weight_decay: float = 5e-4
  momentum: float = 0.9
  target_map: float = 0.23


PRESETS = {
    # 8 simulated CPU devices; a detection dataset of colored shapes written in COCO layout on
    # first use (benchmarks/ssd/shapes.py); a ResNet-18-style backbone of width 16 on 128x128
    # images: feature maps 16, 8, 4, 2, 1.
    "cpu": Config(
        num_cpu_devices=8, mesh="data:-1", layout="batch:data", dataset="shapes",
        optimizations="distributed_eval", image_size=128, num_classes=4, backbone_depth=18,
        backbone_width=16, extra_blocks=(2, 2, 2, 2), anchor_steps=(8, 16, 32, 64, 128),
        anchor_scales=(13, 26, 51, 77, 102, 128), aspect_ratios=((2,), (2, 3), (2, 3), (2,), (2,)),
        global_batch_size=32, eval_batch_size=64, max_epochs=12,
        eval_epochs=(4, 5, 6, 7, 8, 9, 10, 11, 12),
        base_learning_rate=0.04, warmup_steps=100, decay_epochs=(9, 11), weight_decay=5e-4,
        target_map=0.5),
    # Seconds on 2 cores: a ResNet-10-style SSD of width 4 on 120x120 shapes (maps 15, 8, 4),
    # one epoch of 16 images (the contract test's run).
    "tiny": Config(
        num_cpu_devices=8, mesh="data:-1", layout="batch:data", dataset="shapes",
        optimizations="distributed_eval", image_size=120, num_classes=4, backbone_depth=10,
        backbone_width=4, shapes_train=16, shapes_eval=8, global_batch_size=8,
        eval_batch_size=8, bn_span=2, extra_blocks=(2, 2), anchor_steps=(8, 15, 30),
        anchor_scales=(13, 30, 60, 120), aspect_ratios=((2,), (2, 3), (2,)), nms_candidates=16,
        max_detections=16, base_learning_rate=0.05, warmup_steps=1, decay_epochs=(40, 50),
        max_epochs=1, target_map=0.5),
    # MLPerf v0.6 on a full TPU-v3 pod (Kumar et al., arXiv 1909.09756; mlcommons/
    # training_results_v0.6, Google/benchmarks/ssd): 1024 chips, batch 2048, 4-way spatial
    # partitioning of each replica's images, distributed batch norm over 64 images.
    "tpu-v3-2048": Config(
        num_cpu_devices=0, mesh="data:512,spatial:4", layout="batch:data", dataset="coco",
        optimizations="spatial_partitioning,distributed_eval", dtype="bfloat16",
        global_batch_size=2048, eval_batch_size=2048, max_epochs=80,
        eval_epochs=(40, 50, 55, 60, 65, 70, 75, 80), base_learning_rate=2.5e-3,
        warmup_steps=1160, decay_epochs=(56, 70), bn_span=64, target_map=0.23),
    # One 8-GPU host (H100 or H200). SSD-ResNet34's last MLPerf round was v1.0, so the batch and
    # schedule are NVIDIA's v1.0 on one DGX A100 (8 x A100; mlcommons/training_results_v1.0,
    # NVIDIA/results/dgxa100_ngc21.05_mxnet/ssd/result_0.txt, NVIDIA/benchmarks/ssd/
    # implementations/DGXA100_1x8x114/mxnet/config_DGXA100_1x8x114.sh): batch 912 (114 per GPU,
    # batch norm per GPU), 0.003157 per 32 images after 642 warmup steps from 0, x0.1 at epochs
    # 44 and 55, weight decay 1.3e-4; its runs converged at epoch 50 in 8.5 minutes. NVIDIA
    # computed in float16 with MXNet and DALI; here bfloat16.
    "gpu-8xh100": Config(
        num_cpu_devices=0, mesh="data:8", layout="batch:data", dataset="coco", data_workers=16,
        optimizations="distributed_eval", dtype="bfloat16", xla_flags=GPU_XLA_FLAGS,
        global_batch_size=912, eval_batch_size=912, max_epochs=80,
        eval_epochs=(40, 50, 55, 60, 65, 70, 75, 80), base_learning_rate=0.003157,
        warmup_steps=642, warmup_factor=0.0, decay_epochs=(44, 55), weight_decay=1.3e-4,
        bn_span=114, target_map=0.23, kernel_layout="OHWI",
        bn_group_stats=True, pool_backward="index", bn_stacked=True),
    # A 64-chip TPU v4 slice (v4:4x4x4), with Google's MLPerf Training v1.0 SSD on the same 64
    # chips (mlcommons/training_results_v1.0, Google/results/tpu-v4-128-TF/ssd/result_0.txt;
    # Google/benchmarks/ssd/implementations/tpu-v4-128-TF/run_and_time.sh): batch 1024, 0.0031
    # per 32 images after 577 warmup steps (5 epochs), x0.1 at epochs 40 and 50, weight decay
    # 5e-4, batch norm over 64 images; its runs converged at epoch 55 in 1.55 minutes.
    "tpu-v4-128": Config(
        num_cpu_devices=0, mesh="data:-1", layout="batch:data", dataset="coco",
        optimizations="distributed_eval", dtype="bfloat16", global_batch_size=1024,
        eval_batch_size=1024, max_epochs=80, eval_epochs=(40, 50, 55, 60, 65, 70, 75, 80),
        base_learning_rate=0.0031, warmup_steps=577, warmup_factor=0.0, decay_epochs=(40, 50),
        weight_decay=5e-4, bn_span=64, target_map=0.23),
}

# 64 chips of TPU v5p (v5p:4x4x4) and of v6e (v6e:8x8): Google submitted no SSD result on
# either (its last round was v1.0), so these run the v4 submission's batch and schedule above on the
# same number of chips.
PRESETS["tpu-v5p-128"] = PRESETS["tpu-v4-128"]
PRESETS["tpu-v6e-64"] = PRESETS["tpu-v4-128"]


# `./run.sh ablate ssd`: (label, mesh, layout, optimizations); the first row of each mesh is its
# baseline.
ABLATIONS = (
    ("data-parallel", "data:8", "batch:data", "none"),
    ("+ distributed_eval", "data:8", "batch:data", "distributed_eval"),
    ("spatial axis idle", "data:2,spatial:4", "batch:data", "none"),
    ("+ spatial_partitioning", "data:2,spatial:4", "batch:data", "spatial_partitioning"),
)


def validate(c: Config) -> None:
  if c.dataset not in DATASETS:
    raise UserError(f"--dataset={c.dataset}: choose one of {', '.join(DATASETS)}")
  if c.backbone_depth not in DEPTHS:
    raise UserError(f"--backbone_depth={c.backbone_depth}: choose one of "
                    f"{', '.join(map(str, DEPTHS))}")
  show = lambda v: ",".join(map(str, v))
  if any(e not in (0, 2) for e in c.extra_blocks):
    raise UserError(f"--extra_blocks={show(c.extra_blocks)}: each entry is 2 (stride 2) or 0 "
                    f"(unpadded)")
  maps = 1 + len(c.extra_blocks)
  for name, n in (("anchor_steps", maps), ("anchor_scales", maps + 1)):
    got = len(getattr(c, name))
    if got != n:
      raise UserError(f"--{name}={show(getattr(c, name))}: {n} values needed for {maps} feature "
                      f"maps (--extra_blocks={show(c.extra_blocks)}), got {got}")
  ratios = ";".join(show(r) for r in c.aspect_ratios)
  if len(c.aspect_ratios) != maps:
    raise UserError(f"--aspect_ratios={ratios}: one ';'-separated group per feature map ({maps})")
  for name in ("anchor_steps", "anchor_scales"):
    if min(getattr(c, name)) <= 0:
      raise UserError(f"--{name}={show(getattr(c, name))}: pixel sizes must be positive")
  empty = [i + 1 for i, r in enumerate(c.aspect_ratios) if not r]
  if empty:
    raise UserError(f"--aspect_ratios={ratios}: group {empty[0]} is empty; give every feature map "
                    f"at least one ratio, e.g. 2 (or 2,3)")
  if min(min(r) for r in c.aspect_ratios) < 1:
    raise UserError(f"--aspect_ratios={ratios}: ratios are integers >= 1 (2 means 2:1 and 1:2)")
  if len(c.decay_epochs) != 2 or c.decay_epochs[0] >= c.decay_epochs[1]:
    raise UserError(f"--decay_epochs={show(c.decay_epochs)}: two increasing epochs "
                    f"(MLPerf: 40,50)")
  if not 0 < c.target_map < 1:
    raise UserError(f"--target_map={c.target_map}: a fraction in (0, 1)")
  for name in ("crop_trials", "nms_candidates", "max_detections"):
    if getattr(c, name) < 1:
      raise UserError(f"--{name} must be at least 1 (got {getattr(c, name)})")
  require(c, ("base_learning_rate",), positive, "must be positive")
  require(c, ("warmup_steps", "warmup_factor", "weight_decay"), non_negative, "must be >= 0")
  require(c, ("momentum", "min_score"), fraction, "must be in [0, 1)")
  require(c, ("match_iou", "nms_iou"), lambda v: 0 < v <= 1, "an IoU in (0, 1]")
  require(c, ("negative_ratio", "backbone_width", "shapes_train", "shapes_eval"),
          lambda v: v >= 1, "must be at least 1")
  require(c, ("num_classes",), lambda v: v >= 2, "at least 2 (background and one category)")
  require(c, ("bn_span",), lambda v: v >= 0, "must be >= 0 (0: the per-replica batch)")
  weights.check_kernel_layout(c.kernel_layout)
  check_pool_backward(c)
  check_relu_backward(c)
  _check_feature_maps(c)
  if c.backbone_checkpoint:
    _check_backbone_checkpoint(c)


def _check_feature_maps(c: Config) -> None:
  """The image must stay at least one pixel through the backbone and every extra block."""
  if c.image_size < 1:
    raise UserError(f"--image_size={c.image_size}: must be positive (MLPerf: 300)")
  try:
    feature_sizes(c.image_size, c.extra_blocks)
  except ValueError as e:
    raise UserError(f"--image_size={c.image_size}: {e}") from None


def _check_backbone_checkpoint(c: Config) -> None:
  """Cheap checks of --backbone_checkpoint (names and the stem's shape, no weights loaded), so a
  wrong file is refused before any data is read or model built."""
  names = weights.check(c.backbone_checkpoint, f"--backbone_checkpoint={c.backbone_checkpoint}")
  blocks = sum(STAGES[c.backbone_depth][0][:3])
  wanted = {"stem", "BatchNorm_0"} | {f"Block_{i}" for i in range(blocks)}
  missing = sorted(wanted - names) if names is not None else []
  if missing:
    raise UserError(f"--backbone_checkpoint={c.backbone_checkpoint} lacks params {missing}: is "
                    f"it a ResNet-{c.backbone_depth}?")
