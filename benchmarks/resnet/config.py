"""ResNet-50 v1.5 hyperparameters and presets (no jax import here)."""

from __future__ import annotations

import dataclasses

from benchmarks.common.stages import STAGES
from benchmarks.common.weights import check_kernel_layout
from benchmarks.config import (
  Common,
  check_pool_backward,
  check_relu_backward,
  fraction,
  non_negative,
  positive,
  require,
)
from benchmarks.task import Spec
from runtime.errors import UserError
from stepmodel.accelerators import GPU_XLA_FLAGS, TPU_ASYNC_COLLECTIVES

# Every training ruleset of the installed mlperf-logging that defines ResNet-50 (its last round
# was 4.0).
SPEC = Spec(mlperf_name="resnet",
            rulesets=("0.7.0", "1.0.0", "1.1.0", "2.0.0", "2.1.0", "3.0.0", "3.1.0", "4.0.0"),
            metric="top-1 accuracy", target_field="target_accuracy", mlperf_dataset="imagenet")
DATASETS = ("digits", "imagenet", "synthetic")
DATA_LOADERS = ("grain", "dali")     # who decodes ImageNet's training batches (data.py, dali.py)
IMAGENET_TRAIN_EXAMPLES = 1281167   # ILSVRC 2012 training images
OPTIMIZERS = ("lars", "sgd")


@dataclasses.dataclass(frozen=True)
class Config(Common):
  # Data.
  dataset: str = "digits"
  image_size: int = 224
  num_classes: int = 1000
  synthetic_examples: int = 0       # examples per epoch for --dataset=synthetic (0: 1,281,167)
  data_loader: str = "grain"        # ImageNet's training batches: grain, or NVIDIA DALI
  # Model.
  model_depth: int = 50             # ResNet depth: 10, 14, 18, 26, 34, 50, 101 or 152
  model_width: int = 64             # channels of the first stage (64 for ResNet-50)
  bn_span: int = 0                  # examples per batch-norm group; 0: the per-replica batch
  kernel_layout: str = "HWIO"       # convolution kernels stored HWIO, or OHWI (cuDNN's: GPUs)
  bn_group_stats: bool = False      # running statistics kept per batch-norm group (GPUs)
  pool_backward: str = "xla"        # the stem pool's backward: xla, or index (GPUs)
  bn_stacked: bool = False          # batch norm as one (2, c) scale and bias, stacked sums (GPUs)
  relu_backward: str = "output"     # a block's last ReLU's backward: output, or mask (GPUs)
  bn_flat: bool = False             # every batch norm's scale and bias in one parameter (GPUs)
  # Optimizer (MLPerf ResNet keys).
  optimizer: str = "lars"
  base_learning_rate: float = 31.2
  end_learning_rate: float = 1e-4
  warmup_epochs: float = 25.0
  decay_poly_power: float = 2.0
  schedule_epochs: float = 0.0      # length of the lr schedule in epochs; 0: max_epochs
  weight_decay: float = 1e-4
  momentum: float = 0.9
  lars_trust_coefficient: float = 0.001
  lars_epsilon: float = 0.0
  label_smoothing: float = 0.1
  target_accuracy: float = 0.759


PRESETS = {
    # 8 simulated CPU devices, scikit-learn's digits (1,797 real 8x8 scans of handwritten digits,
    # shipped with the package) upsampled to 32x32, a ResNet-14 of width 16 (bottleneck blocks,
    # one per stage): reaches its own 0.98 target in 7-8 epochs (under a minute on 2 cores).
    "cpu": Config(
        num_cpu_devices=8, mesh="data:-1", layout="batch:data", dataset="digits",
        optimizations="distributed_eval",
        image_size=32, num_classes=10, model_depth=14, model_width=16, global_batch_size=64,
        eval_batch_size=128, max_epochs=40, eval_every=1, optimizer="lars",
        base_learning_rate=2.0, warmup_epochs=2.0, schedule_epochs=40.0, weight_decay=1e-4,
        target_accuracy=0.98),
    # Seconds on 2 cores: a ResNet-10 of width 8 for one epoch (the contract test's run).
    "tiny": Config(
        num_cpu_devices=8, mesh="data:-1", layout="batch:data", dataset="digits",
        optimizations="distributed_eval", image_size=32, num_classes=10, model_depth=10,
        model_width=8, bn_span=4, global_batch_size=32, eval_batch_size=64, max_epochs=1,
        optimizer="lars", base_learning_rate=1.0, warmup_epochs=0.2, schedule_epochs=1.0,
        target_accuracy=0.98),
    # MLPerf v0.6 on a full TPU-v3 pod (1024 chips, 2048 cores), as Google ran it (Kumar et al.,
    # arXiv 1909.09756; mlcommons/training_results_v0.6, Google/benchmarks/resnet). The replicas
    # span a 64 x 32 mesh so gradients are summed in two phases; libtpu's asynchronous
    # collectives overlap the weights' all-gathers with the kernels.
    "tpu-v3-2048": Config(
        num_cpu_devices=0, mesh="x:64,y:32", layout="batch:x+y", dataset="imagenet",
        optimizations="grad_sum_2d,weight_update_sharding,distributed_eval",
        libtpu_flags=TPU_ASYNC_COLLECTIVES,
        image_size=224, num_classes=1000, model_depth=50, model_width=64, dtype="bfloat16",
        global_batch_size=32768, max_epochs=72, eval_every=4, optimizer="lars",
        base_learning_rate=31.2, warmup_epochs=25.0, schedule_epochs=72.0, weight_decay=1e-4,
        bn_span=128, target_accuracy=0.759),
    # One 8-GPU host (H100 or H200), with the batch and schedule of NVIDIA's MLPerf Training
    # v4.0 ResNet-50 on 8 x H100 (mlcommons/training_results_v4.0, NVIDIA/results/
    # eos_ngc24.04_mxnet/resnet/result_0.txt; the same on 8 x H200, h200_ngc24.04_mxnet): batch
    # 3200 (400 per GPU, batch norm per GPU), LARS 11.0 after 2 warmup epochs, decaying to 1e-4
    # (power 2) over 37 epochs, weight decay 5e-5, evaluation every 4 epochs from epoch 3; its
    # runs converged at epoch 35 in 13.3 minutes. NVIDIA computed in float16 with MXNet and DALI;
    # here bfloat16, with XLA's latency-hiding scheduler.
    "gpu-8xh100": Config(
        num_cpu_devices=0, mesh="data:8", layout="batch:data", dataset="imagenet",
        data_workers=16, optimizations="distributed_eval", dtype="bfloat16",
        xla_flags=GPU_XLA_FLAGS, image_size=224, num_classes=1000, model_depth=50,
        model_width=64, global_batch_size=3200, max_epochs=37,
        eval_epochs=tuple(range(3, 37, 4)), optimizer="lars", base_learning_rate=11.0,
        warmup_epochs=2.0, schedule_epochs=37.0, weight_decay=5e-5, momentum=0.9,
        bn_span=400, target_accuracy=0.759, kernel_layout="OHWI",
        bn_group_stats=True, pool_backward="index", bn_stacked=True, relu_backward="mask",
        bn_flat=True),
    # A 64-chip TPU v4 slice (v4:4x4x4), with Google's MLPerf Training v1.0 ResNet-50 on the
    # same 64 chips (mlcommons/training_results_v1.0, Google/results/tpu-v4-128-TF/resnet/
    # result_0.txt; Google/benchmarks/resnet/implementations/tpu-v4-128-TF/run_and_time.sh):
    # batch 8192, LARS 17 after 5 warmup epochs, 6,095 decay steps (44 epochs with the warmup),
    # weight decay 2e-4, batch norm over 128 images, evaluation every 625 steps (4 epochs here);
    # its runs converged at epoch 42 in 4.30 minutes.
    "tpu-v4-128": Config(
        num_cpu_devices=0, mesh="data:-1", layout="batch:data", dataset="imagenet",
        optimizations="weight_update_sharding,distributed_eval", dtype="bfloat16",
        image_size=224, num_classes=1000, model_depth=50, model_width=64,
        global_batch_size=8192, max_epochs=44, eval_every=4, optimizer="lars",
        base_learning_rate=17.0, warmup_epochs=5.0, schedule_epochs=44.0, weight_decay=2e-4,
        momentum=0.9, bn_span=128, target_accuracy=0.759),
}
# 64 chips of TPU v5p (v5p:4x4x4) and of v6e (v6e:8x8): no MLPerf ResNet-50 result exists on
# either (Google's last ResNet submissions were on v4), so these run the v4 submission's batch
# and schedule above on the same number of chips.
PRESETS["tpu-v5p-128"] = PRESETS["tpu-v4-128"]
PRESETS["tpu-v6e-64"] = PRESETS["tpu-v4-128"]


# `./run.sh ablate resnet`: (label, mesh, layout, optimizations); the first row of each mesh is
# its baseline.
ABLATIONS = (
    ("data-parallel", "data:8", "batch:data", "none"),
    ("+ distributed_eval", "data:8", "batch:data", "distributed_eval"),
    ("+ weight_update_sharding", "data:8", "batch:data", "weight_update_sharding"),
    ("+ grad_accum:2", "data:8", "batch:data", "grad_accum:2"),
    ("batch over x+y", "x:4,y:2", "batch:x+y", "none"),
    ("+ grad_sum_2d", "x:4,y:2", "batch:x+y", "grad_sum_2d"),
    ("+ grad_sum_2d, weight_update_sharding", "x:4,y:2", "batch:x+y",
     "grad_sum_2d,weight_update_sharding"),
    ("spatial axis idle", "data:2,spatial:4", "batch:data", "none"),
    ("+ spatial_partitioning", "data:2,spatial:4", "batch:data", "spatial_partitioning"),
)


def validate(c: Config) -> None:
  if c.dataset not in DATASETS:
    raise UserError(f"--dataset={c.dataset}: choose one of {', '.join(DATASETS)}")
  if c.data_loader not in DATA_LOADERS:
    raise UserError(f"--data_loader={c.data_loader}: choose one of {', '.join(DATA_LOADERS)}")
  if c.data_loader == "dali" and c.dataset != "imagenet":
    raise UserError(f"--data_loader=dali reads ImageNet's JPEGs; --dataset={c.dataset} is made "
                    f"in numpy: use --data_loader=grain with it")
  check_kernel_layout(c.kernel_layout)
  check_pool_backward(c)
  check_relu_backward(c)
  if c.bn_flat and not c.bn_stacked:
    raise UserError("--bn_flat keeps every batch norm's stacked (2, channels) scale and bias in "
                    "one parameter: add --bn_stacked")
  if c.optimizer not in OPTIMIZERS:
    raise UserError(f"--optimizer={c.optimizer}: choose one of {', '.join(OPTIMIZERS)}")
  if c.model_depth not in STAGES:
    raise UserError(f"--model_depth={c.model_depth}: choose one of "
                    f"{', '.join(map(str, sorted(STAGES)))}")
  if c.image_size < 32:
    raise UserError(f"--image_size={c.image_size}: ResNet needs at least 32 pixels")
  if not 0 < c.target_accuracy <= 1:
    raise UserError(f"--target_accuracy={c.target_accuracy}: a fraction in (0, 1]")
  require(c, ("base_learning_rate", "decay_poly_power", "lars_trust_coefficient"), positive,
          "must be positive")
  require(c, ("end_learning_rate", "warmup_epochs", "schedule_epochs", "weight_decay",
              "lars_epsilon"), non_negative, "must be >= 0")
  if c.end_learning_rate > c.base_learning_rate:
    raise UserError(f"--end_learning_rate={c.end_learning_rate} is above --base_learning_rate="
                    f"{c.base_learning_rate}; the schedule decays from base to end")
  require(c, ("momentum", "label_smoothing"), fraction, "must be in [0, 1)")
  require(c, ("num_classes",), lambda v: v >= 2, "a classifier needs at least 2 classes")
  require(c, ("model_width",), lambda v: v >= 1, "must be at least 1 channel")
  require(c, ("bn_span", "synthetic_examples"), lambda v: v >= 0,
          "must be >= 0 (0: the default)")
  if c.dataset == "synthetic":
    examples = c.synthetic_examples or IMAGENET_TRAIN_EXAMPLES
    for flag, batch in (("global_batch_size", c.global_batch_size),
                        ("eval_batch_size", c.eval_batch_size)):
      if examples < batch:
        raise UserError(f"--dataset=synthetic: {examples:,} examples an epoch "
                        f"(--synthetic_examples) are fewer than one batch (--{flag}={batch}); "
                        f"give at least one batch's worth")
