"""The accelerators, as data: one table that topology parsing, the peak tables, the step-time
model and the hardware presets read.

- `GENERATIONS`: the Cloud TPU generations, per chip and per JAX device, with the shape of their
  interconnect and the step-time model's fitted constants.
- `GPUS`: NVIDIA GPUs: their dense bfloat16 peak (MFU), and for those a `--topology` compiles
  for, what XLA's GPU compiler reads of them (`target_config`) and their host's links.
- `SYSTEMS`: the machines the benchmarks' hardware presets are made for (`--config=<name>`):
  a TPU slice by its topology, or a GPU host by its GPUs.
- The compilers' flags the presets on each platform set (`TPU_ASYNC_COLLECTIVES`,
  `GPU_XLA_FLAGS`).

A new TPU generation is one `Generation` row; a new machine one `System` row.

A TPU slice is a grid of chips joined by the inter-chip interconnect (ICI): each chip has a link
to its nearest neighbour in each direction of each grid dimension (a 2-D grid on v2/v3/v5e, a
3-D grid on v4/v5p), and along some dimensions the last chip links back to the first (a torus).
A chip holds one or two TensorCores. JAX shows one device per TensorCore on v2/v3, and one per
chip on v4 and v5p ("megacore": the chip's two TensorCores act as one device).

Each figure below cites where it comes from. ICI figures are given per link and per direction:
the Cloud docs give either a bidirectional per-chip total or a pod's bisection bandwidth, and the
per-link figure is derived from them (the derivation is in the comment). Where no public figure
exists the comment says what is assumed. The `S_*` constants below are the sources, cited by
each `Generation.sources`.
"""

from __future__ import annotations

import dataclasses

GiB = 1 << 30

S_V2 = "https://cloud.google.com/tpu/docs/v2 (Cloud TPU v2 system architecture)"
S_V3 = "https://cloud.google.com/tpu/docs/v3 (Cloud TPU v3 system architecture)"
S_V4 = "https://cloud.google.com/tpu/docs/v4 (Cloud TPU v4 system architecture)"
S_V5E = "https://cloud.google.com/tpu/docs/v5e (Cloud TPU v5e system architecture)"
S_V5P = "https://cloud.google.com/tpu/docs/v5p (Cloud TPU v5p system architecture)"
S_V6E = "https://cloud.google.com/tpu/docs/v6e (Cloud TPU v6e (Trillium) system architecture)"
S_JOUPPI20 = ("Jouppi et al., A Domain-Specific Supercomputer for Training Deep Neural Networks, "
              "CACM 63(7), 2020 (TPUv2/v3: 2-D torus, 4 ICI links per chip)")
S_V4PAPER = ("Jouppi et al., TPU v4: An Optically Reconfigurable Supercomputer for Machine "
             "Learning with Hardware Support for Embeddings, ISCA 2023, arXiv:2304.01433")
S_KUMAR19 = ("Kumar et al., Scale MLPerf-0.6 models on Google TPU-v3 Pods, arXiv:1909.09756 "
             "(2-D gradient summation on the v3 pod torus)")
S_SCALING = ("Austin et al., How to Scale Your Model, ch. 2 'How to think about TPUs', "
             "https://jax-ml.github.io/scaling-book/tpus/ (per-link one-way ICI bandwidths)")
S_ASSUMED = "assumption of this module (no public figure): see the comment at the figure"


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The step-time model's constants for one TPU generation (`stepmodel.steptime`) or one GPU
  (`stepmodel.gpu`): at most three, fitted on measured steps (`./run.sh scale --fit`) or left
  at their physical defaults. A TPU's third is the ICI latency, a GPU's the tensor cores'
  achieved fraction of their peak (the GPU points, on one GPU, have no collective to fit)."""
  kernel_overhead_s: float = 0.0     # fixed time of each kernel (launch, pipeline fill)
  hbm_efficiency: float = 1.0        # achieved fraction of the HBM bandwidth
  ici_latency_s: float | None = None  # per step of a ring collective (None: the generation's)
  matrix_efficiency: float = 1.0     # GPUs: achieved fraction of the tensor cores' peak
  fitted_on: str = "nothing: the physical figures (no overhead, the full HBM bandwidth)"
  points: tuple[str, ...] = ()       # the names of the points it was fitted on
  # How far the model has been off on steps it was not fitted on, on this hardware: what a
  # verdict's step and minutes can be trusted to (the dry run prints it beside each).
  held_out: str = "never held against a measured step"


@dataclasses.dataclass(frozen=True)
class Generation:
  """One TPU generation: per-chip figures and the shape of its interconnect."""
  name: str                        # as in topology names: "v3" for "v3:4x4"
  device_kind: str                 # jax Device.device_kind
  cloud_name: str                  # Cloud TPU's accelerator types: "<cloud_name>-<cores>"
  cores_per_chip: int              # TensorCores per chip
  megacore_default: bool           # the default JAX device is a whole chip
  hbm_bytes_per_chip: int
  peak_flops_per_chip: float       # bf16 FLOP/s
  hbm_bytes_per_s_per_chip: float
  ici_link_bytes_per_s: float      # one direction of one link
  ici_links_per_chip: int          # = 2 * torus_dims (one per direction of each dimension)
  torus_dims: int                  # 2 or 3: the dimensions of a topology name (v3:4x4, v4:4x4x4)
  ici_latency_s: float             # per hop / per step of a ring collective (assumed)
  pod_chips: tuple[int, ...]       # the full pod's chip grid
  sources: tuple[str, ...]
  clock_hz: float | None = None    # TensorCore clock (None: not published); prices the TPU
                                   # compiler's own per-kernel estimate, in cycles
  mxu_width: int = 128             # side of the systolic matrix unit (v2-v5: 128 x 128)
  # Elementwise 32-bit operations a TensorCore's vector unit completes per cycle (None: not
  # published, and the model leaves the vector unit's time out).
  vector_ops_per_cycle: int | None = None
  calibration: Calibration = Calibration()
  # libtpu offers one device per TensorCore of a megacore chip on request (`v4:8x8x16:cores`).
  splits_megacore: bool = False


# ICI latency: no generation's per-hop latency is published. 1 us per collective step is
# assumed for all (the order the scaling book quotes for one ICI hop plus launch); it only
# matters for small messages.
_LATENCY = 1e-6

# The TPUv2/v3 TensorCore's vector unit (Norrie, Patil et al., "Google's Training Chips
# Revealed: TPUv2 and TPUv3", Hot Chips 32, 2020; IEEE Micro 41(2), 2021): 128 lanes x 8
# sublanes, each sublane with two 32-bit ALUs, 2,048 vector ALUs a core: 2 x 8 x 128
# elementwise operations a cycle. Later generations' vector units are not described at this
# level. The TPU compiler's own estimates of threefry's kernels agree within 15%
# (tests/test_kernels.py).
_VECTOR_V2_V3 = 2 * 8 * 128

GENERATIONS: dict[str, Generation] = {
    "v2": Generation(
        name="v2", device_kind="TPU v2", cloud_name="v2",
        cores_per_chip=2, megacore_default=False,
        hbm_bytes_per_chip=16 * GiB,            # 8 GiB per core x 2 cores (Cloud v2 docs)
        peak_flops_per_chip=45e12,              # 45 TFLOPS bf16 per chip (Cloud v2 docs)
        hbm_bytes_per_s_per_chip=600e9,         # 600 GBps (Cloud v2 docs; Jouppi 2020 says 700)
        # No per-link figure found for v2: assumed v3's 100 GB/s scaled by the per-link
        # rates Jouppi et al. 2020 give (496 vs 656 Gbit/s): 100e9 * 496 / 656 = 75.6 GB/s.
        ici_link_bytes_per_s=100e9 * 496 / 656,
        ici_links_per_chip=4, torus_dims=2, ici_latency_s=_LATENCY,
        pod_chips=(16, 16),                     # 256-chip pod, 2-D torus (Cloud v2 docs)
        sources=(S_V2, S_JOUPPI20, S_ASSUMED),
        clock_hz=700e6,                         # 700 MHz (Jouppi et al. 2020, Table 3)
        vector_ops_per_cycle=_VECTOR_V2_V3),
    "v3": Generation(
        name="v3", device_kind="TPU v3", cloud_name="v3",
        cores_per_chip=2, megacore_default=False,
        hbm_bytes_per_chip=32 * GiB,            # 32 GiB per chip = 16 GiB per core (Cloud v3)
        peak_flops_per_chip=123e12,             # 123 TFLOPS bf16 (Cloud v3 docs)
        hbm_bytes_per_s_per_chip=900e9,         # 900 GBps (Cloud v3 docs)
        # Cloud v3 docs: bisection bandwidth of the 1024-chip (32x32 torus) pod is 6.4 TB/s.
        # Cutting a 32x32 torus in half cuts 32 rows x 2 (wraparound) = 64 links:
        # 6.4e12 / 64 = 100 GB/s per link per direction (the scaling book lists 1e11 one-way).
        ici_link_bytes_per_s=100e9,
        ici_links_per_chip=4, torus_dims=2, ici_latency_s=_LATENCY,
        pod_chips=(32, 32),                     # 1024 chips, 2-D torus (Cloud v3 docs)
        sources=(S_V3, S_JOUPPI20, S_KUMAR19, S_SCALING, S_ASSUMED),
        clock_hz=940e6,                         # 940 MHz (Jouppi et al. 2020, Table 3)
        vector_ops_per_cycle=_VECTOR_V2_V3,
        # Fitted on the measured train steps of Google's MLPerf v0.6 ResNet-50 at 16 and 1024
        # chips (tools/pod/points/google-v0.6-tpu-v3.json), the two ends of its scaling:
        # `./run.sh scale all --fit --fit_on=resnet-16,resnet-1024` (2026-12-02). docs/pod.md
        # gives the held-out points and why SSD's and the Transformer's are not fitted.
        calibration=Calibration(
            kernel_overhead_s=2.59e-6, hbm_efficiency=0.698, ici_latency_s=0.34e-6,
            fitted_on="resnet-16 and resnet-1024, Google's MLPerf v0.6 measured steps",
            points=("resnet-16", "resnet-1024"),
            held_out=("ResNet-50's four other v0.6 slices 0.87-0.98 of Google's steps; SSD "
                      "0.63-0.89 on the device alone, its steps being Google's hosts' input "
                      "pipelines' (their line, fitted on two, puts the four others at "
                      "1.03-1.08); the Transformer 0.80-1.50, whose program differs more "
                      "(docs/pod.md)"))),
    "v4": Generation(
        # JAX on a v4 VM shows one device per chip (megacore; Cloud v4 docs); libtpu's
        # compile-only topology needs chip_config_name="megacore" for that (stepmodel/topology.py).
        name="v4", device_kind="TPU v4", cloud_name="v4",
        cores_per_chip=2, megacore_default=True,
        hbm_bytes_per_chip=32 * GiB,            # 32 GiB (Cloud v4 docs)
        peak_flops_per_chip=275e12,             # 275 TFLOPS bf16 (Cloud v4 docs)
        hbm_bytes_per_s_per_chip=1200e9,        # 1200 GBps (Cloud v4 docs)
        # Cloud v4 docs: bisection bandwidth per 4096-chip pod is 24 TB/s. A 16x16x16 torus cut
        # in half cuts 16*16 x 2 (wraparound) = 512 links: 24e12 / 512 = 46.9 GB/s per link per
        # direction (the scaling book lists 4.5e10 one-way for v4p).
        ici_link_bytes_per_s=24e12 / 512,
        ici_links_per_chip=6, torus_dims=3, ici_latency_s=_LATENCY,
        pod_chips=(16, 16, 16),                 # 4096 chips, 3-D (Cloud v4 docs; v4 paper)
        sources=(S_V4, S_V4PAPER, S_SCALING, S_ASSUMED),
        clock_hz=1050e6,                        # 1050 MHz (v4 paper, its v3/v4 table)
        splits_megacore=True,
        # Fitted on Google's MLPerf v0.7 ResNet-50 steps at 8 and 256 chips
        # (tools/pod/points/google-v0.7-tpu-v4.json; `./run.sh scale all --points=... --fit
        # --fit_on=resnet-v4-8,resnet-v4-256`, 2026-12-05), the fit lands on its bounds: no
        # overhead, the full HBM bandwidth, no ICI latency, and still models Google's steps
        # 1.00-1.15x. So the constants stay the physical figures (1.00-1.13x); docs/pod.md.
        calibration=Calibration(
            fitted_on="nothing: the physical figures (a fit on Google's v0.7 ResNet steps at 8 "
                      "and 256 chips lands on them)",
            held_out=("Google's v0.7 steps: ResNet-50 1.00-1.13x at 8, 64 and 256 chips; SSD "
                      "0.66-1.03x on the device alone, its steps being Google's hosts' input "
                      "pipelines' (their line, fitted on two, puts the third at 0.97x; "
                      "docs/pod.md)"))),
    "v5e": Generation(
        name="v5e", device_kind="TPU v5 lite", cloud_name="v5litepod",
        cores_per_chip=1, megacore_default=False,
        hbm_bytes_per_chip=16 * GiB,            # 16 GB (Cloud v5e docs)
        peak_flops_per_chip=197e12,             # 197 TFLOPs bf16 (Cloud v5e docs)
        hbm_bytes_per_s_per_chip=819e9,         # 819 GBps (Cloud v5e docs)
        # Cloud v5e docs: 400 GBps bidirectional ICI per chip over 4 ICI ports:
        # 400e9 / 4 / 2 = 50 GB/s per link per direction. Cross-check: the 16x16 torus pod's
        # bisection, 16 x 2 = 32 links x 50 GB/s = 1.6 TB/s, is what the docs list.
        ici_link_bytes_per_s=50e9,
        ici_links_per_chip=4, torus_dims=2, ici_latency_s=_LATENCY,
        pod_chips=(16, 16),                     # 256 chips, 2-D torus (Cloud v5e docs)
        sources=(S_V5E, S_SCALING, S_ASSUMED)),
    "v5p": Generation(
        name="v5p", device_kind="TPU v5", cloud_name="v5p",
        cores_per_chip=2, megacore_default=True,
        hbm_bytes_per_chip=95 * GiB,            # 95 GiB usable of 96 (Cloud v5p docs)
        peak_flops_per_chip=459e12,             # 459 TFLOPs bf16 (Cloud v5p docs)
        hbm_bytes_per_s_per_chip=2765e9,        # 2765 GBps = 2575 GiBps (Cloud v5p docs)
        # Cloud v5p docs: 1200 GBps bidirectional ICI per chip (older page: 4800 Gbps = 600 GB/s
        # one way) over 6 links: 1200e9 / 6 / 2 = 100 GB/s per link per direction.
        ici_link_bytes_per_s=100e9,
        ici_links_per_chip=6, torus_dims=3, ici_latency_s=_LATENCY,
        pod_chips=(16, 20, 28),                 # 8960 chips, 3-D torus (Cloud v5p docs)
        sources=(S_V5P, S_V4PAPER, S_SCALING, S_ASSUMED)),
    "v6e": Generation(
        name="v6e", device_kind="TPU v6 lite", cloud_name="v6e",
        cores_per_chip=1, megacore_default=False,
        hbm_bytes_per_chip=32 * GiB,            # 32 GB (Cloud v6e docs)
        peak_flops_per_chip=918e12,             # 918 TFLOPs bf16 (Cloud v6e docs)
        hbm_bytes_per_s_per_chip=1638e9,        # 1638 GBps (Cloud v6e docs)
        # Cloud v6e docs: 800 GBps bidirectional ICI per chip over 4 ICI ports:
        # 800e9 / 4 / 2 = 100 GB/s per link per direction. Cross-check: the 16x16 torus pod's
        # bisection, 16 x 2 = 32 links x 100 GB/s = 3.2 TB/s, is what the docs list.
        ici_link_bytes_per_s=100e9,
        ici_links_per_chip=4, torus_dims=2, ici_latency_s=_LATENCY,
        pod_chips=(16, 16),                     # 256 chips, 2-D torus (Cloud v6e docs)
        sources=(S_V6E, S_ASSUMED),
        mxu_width=256),                         # two 256 x 256 MXUs per TensorCore (v6e docs)
}


def generation(name_or_kind: str) -> Generation:
  """The Generation of a name ("v3"), a topology name ("v3:4x4") or a device_kind."""
  key = name_or_kind.split(":")[0]
  if key in GENERATIONS:
    return GENERATIONS[key]
  for g in GENERATIONS.values():
    if g.device_kind == name_or_kind:
      return g
  raise KeyError(f"unknown TPU generation {name_or_kind!r}; known: {sorted(GENERATIONS)}")


def per_device(gen: Generation, megacore: bool) -> dict[str, float]:
  """HBM bytes, peak bf16 FLOP/s, HBM bytes/s and vector-unit operations/s (None where the
  generation's vector unit is not published) of ONE jax device.

  A device is one TensorCore (a chip's figures divided by `cores_per_chip`), or, when
  `megacore` (v5p by default, v4 with `chip_config_name="megacore"`), the whole chip. HBM is
  split evenly between a chip's cores (v2/v3 docs give 8/16 GiB per core).
  """
  n = 1 if megacore else gen.cores_per_chip
  vector = (gen.vector_ops_per_cycle * gen.clock_hz * gen.cores_per_chip / n
            if gen.vector_ops_per_cycle and gen.clock_hz else None)
  return {
      "hbm_bytes": gen.hbm_bytes_per_chip // n,
      "peak_flops": gen.peak_flops_per_chip / n,
      "hbm_bytes_per_s": gen.hbm_bytes_per_s_per_chip / n,
      "vector_ops_per_s": vector,
  }


def wraparound(gen: Generation, chips: tuple[int, ...]) -> tuple[bool, ...]:
  """Whether each dimension of a slice's chip grid `chips` has wraparound links.

  v2/v3/v5e: the pod is a 2-D torus (Cloud docs; Kumar et al. 2019 use the v3 pod's
  wraparound links); a slice has them only along a dimension that spans the whole pod
  (assumed: a smaller slice is cut out of the pod's torus, so its edges link to chips outside
  it). v4/v5p: the optical circuit switches close the faces of 4x4x4-chip cubes, so a slice
  made of whole cubes (every dimension a multiple of 4) is a 3-D torus in every dimension
  (Cloud v4 docs: "3D torus on slices where ... each dimension is a multiple of 4"; Cloud v5p
  docs: "All 4x4x4 and larger slices (one cube) have full 3D torus"; v4 paper section 2);
  a slice smaller than a cube (2x2x1, 2x2x4, 2x4x4) is assumed a mesh, since no document
  gives it wraparound links.
  """
  chips = tuple(chips) + (1,) * (gen.torus_dims - len(chips))
  if gen.torus_dims == 3:
    cubes = all(n % 4 == 0 for n in chips)
    return tuple(cubes and n > 1 for n in chips)
  pod = gen.pod_chips + (1,) * (len(chips) - len(gen.pod_chips))
  return tuple(n > 1 and n == p for n, p in zip(chips, pod))


# --- NVIDIA GPUs and their hosts ----------------------------------------------------------------

S_H100 = ("NVIDIA H100 Tensor Core GPU datasheet (SXM5: 80 GB HBM3, 3.35 TB/s, 989 TFLOPS BF16 "
          "dense, NVLink 900 GB/s) and the NVIDIA H100 Tensor Core GPU Architecture whitepaper "
          "(132 SMs of 128 FP32 cores, 50 MB L2, 228 KB shared memory per SM, compute "
          "capability 9.0)")
S_H200 = ("NVIDIA H200 Tensor Core GPU datasheet (SXM: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS BF16 "
          "dense, NVLink 900 GB/s); the H100's SMs, L2 and compute capability (the H200 is the "
          "GH100 chip with larger, faster memory, same datasheet family)")
S_B200 = ("NVIDIA HGX B200 / DGX B200 datasheets (per GPU: 180 GB HBM3e, 7.7 TB/s of the "
          "HGX's 62 TB/s over 8, 2.25 PFLOPS FP16/BF16 dense, NVLink 5 1.8 TB/s); compute "
          "capability 10.0 (CUDA C Programming Guide, compute capabilities table)")
S_A100 = "NVIDIA A100 Tensor Core GPU datasheet (SXM 80 GB: 2,039 GB/s, 312 TFLOPS BF16 dense)"
S_DGX = ("DGX H100 / DGX H200 / DGX B200 datasheets: 8 GPUs on NVSwitch, 8 single-port "
         "ConnectX-7 400 Gb/s InfiniBand or Ethernet adapters for the compute network (one per "
         "GPU: 50 GB/s per GPU per direction)")
S_NCCL = ("NCCL's own cost model, NVIDIA/nccl src/graph/tuning.cc (baseLat, hwLat: ring, LL128 "
          "protocol: 3.6 us per collective, 2.5 us per ring step on NVLink and on the network)")


@dataclasses.dataclass(frozen=True)
class Gpu:
  """One NVIDIA GPU: how jax names it, its peak, its memory, what XLA's GPU compiler reads of it
  (a `GpuTargetConfig`: `target_config`), and the links of the 8-GPU host it comes in. The
  datasheets also give twice the FLOP/s "with sparsity", which dense training does not reach."""
  name: str                        # as in topology names (`h100:8`) and presets
  kind_pattern: str                # found in jax's device_kind, e.g. "NVIDIA H100 80GB HBM3"
  peak_flops: float                # dense bfloat16 tensor-core FLOP/s
  source: str
  device_kind: str = ""            # what the compile-only devices are named (device_kind)
  memory_bytes: int = 0            # HBM as the datasheet gives it (NVIDIA's GB are GiB here)
  usable_bytes: int = 0            # what CUDA leaves a program (the fit check's limit)
  hbm_bytes_per_s: float = 0.0
  sms: int = 0                     # streaming multiprocessors
  fp32_per_sm: int = 128           # FP32 cores per SM (XLA's fpus_per_core)
  clock_hz: float = 0.0            # the boost clock the tensor-core peak is quoted at
  l2_bytes: int = 0
  compute_capability: tuple[int, int] = (0, 0)
  shared_per_sm: int = 233472      # 228 KB (Hopper and Blackwell: CUDA's compute-capability table)
  shared_per_block_optin: int = 232448   # 227 KB a block may opt in to
  nvlink_bytes_per_s: float = 0.0  # one direction, per GPU, to the host's NVSwitch
  network_bytes_per_s: float = 0.0  # one direction, per GPU, between hosts
  gpus_per_host: int = 8
  nvlink_latency_s: float = 2.5e-6  # per ring step (S_NCCL)
  network_latency_s: float = 2.5e-6
  collective_latency_s: float = 3.6e-6   # per collective (S_NCCL)
  sources: tuple[str, ...] = ()
  calibration: Calibration = Calibration()

  @property
  def compiles(self) -> bool:
    """Whether the table has what XLA's GPU compiler needs to compile for it (`--topology`)."""
    return bool(self.sms and self.device_kind)


# Usable memory. An H100 80 GB shows CUDA 84,929,347,584 of its 85,899,345,920 bytes (79.1 GiB;
# the figure JAX's memory_stats gives there). No other GPU's figure was read on one: the others
# are assumed to keep the same 970 MB back (`.ci/accelerator` saves the figure where it runs).
_RESERVED = 80 * GiB - 84929347584

# Fitted on the five train steps measured on one H200 (tools/pod/points/h200-2026-12-04.json):
# `./run.sh scale all --points=tools/pod/points/h200-2026-12-04.json --fit
# --fit_on=resnet-h200,ssd-h200,transformer-h200,lm-h200,llama-h200` (2026-12-05); each point's
# error when it is left out of the fit is in docs/gpu.md. The H100 borrows them (the same SMs,
# a slower HBM whose achieved fraction is assumed the same); the B200 too, untested.
_H200_FIT = Calibration(
    kernel_overhead_s=9.38e-6, hbm_efficiency=0.715, matrix_efficiency=0.788,
    fitted_on="the five steps measured on one H200, 2026-12-04 (MAPE 4.1%)",
    points=("resnet-h200", "ssd-h200", "transformer-h200", "lm-h200", "llama-h200"),
    held_out=("each of the five H200 steps from constants fitted on the other four: 0.88-1.15, "
              "MAPE 7.7% (docs/gpu.md); NCCL's collectives never measured"))
_BORROWED = dataclasses.replace(
    _H200_FIT, points=(), fitted_on="the H200's constants, borrowed: never fitted on this GPU",
    held_out="never held against a step measured on this GPU (the H200's: MAPE 7.7% held out)")

# The first whose pattern is found in a device_kind wins.
GPUS = (
    Gpu("b200", "B200", 2.25e15, S_B200, device_kind="NVIDIA B200",
        memory_bytes=180 * GiB, usable_bytes=180 * GiB - _RESERVED, hbm_bytes_per_s=7.7e12,
        # Not in NVIDIA's datasheets, assumed: 148 SMs (two dies of 74) and a 126 MB L2, as
        # device queries of B200s are reported; the clock is the peak's, 2.25e15 / (148 SMs x
        # 8,192 dense BF16 FLOP per SM per clock) = 1.86 GHz, assuming twice Hopper's per-SM
        # rate (as the per-GPU peaks at similar clocks imply). The XLA compiler reads these for
        # its kernels' launch shapes; the step model uses only the datasheet's peak and HBM.
        sms=148, clock_hz=2.25e15 / (148 * 8192), l2_bytes=126 * (1 << 20),
        compute_capability=(10, 0), nvlink_bytes_per_s=900e9, network_bytes_per_s=50e9,
        sources=(S_B200, S_DGX, S_NCCL, S_ASSUMED), calibration=_BORROWED),
    Gpu("h200", "H200", 989e12, S_H200, device_kind="NVIDIA H200",
        memory_bytes=141 * GiB, usable_bytes=141 * GiB - _RESERVED, hbm_bytes_per_s=4.8e12,
        sms=132, clock_hz=989e12 / (132 * 4096), l2_bytes=50 * (1 << 20),
        compute_capability=(9, 0), nvlink_bytes_per_s=450e9, network_bytes_per_s=50e9,
        sources=(S_H200, S_H100, S_DGX, S_NCCL, S_ASSUMED), calibration=_H200_FIT),
    Gpu("h100-pcie", "H100 PCIe", 756e12,
        "NVIDIA H100 datasheet: 756 TFLOPS BF16 dense (PCIe)"),
    Gpu("h100", "H100", 989e12, S_H100, device_kind="NVIDIA H100 80GB HBM3",
        memory_bytes=80 * GiB, usable_bytes=84929347584, hbm_bytes_per_s=3.35e12,
        # The peak's clock: 989e12 / (132 SMs x 4,096 dense BF16 FLOP per SM per clock, the
        # whitepaper's per-SM tensor-core rate) = 1.83 GHz.
        sms=132, clock_hz=989e12 / (132 * 4096), l2_bytes=50 * (1 << 20),
        compute_capability=(9, 0), nvlink_bytes_per_s=450e9, network_bytes_per_s=50e9,
        sources=(S_H100, S_DGX, S_NCCL), calibration=_BORROWED),
    Gpu("a100", "A100", 312e12, S_A100),
)


def gpu(name: str) -> Gpu:
  """The GPU of a table name ("h100", any case) or a jax device_kind; KeyError otherwise."""
  key = name.lower()
  for g in GPUS:
    if g.name == key:
      return g
  for g in GPUS:
    if g.kind_pattern in name:
      return g
  raise KeyError(f"unknown GPU {name!r}; known: {', '.join(g.name for g in GPUS)}")


def target_config(g: Gpu, cudnn: tuple[int, int, int], cuda: tuple[int, int]) -> str:
  """XLA's `GpuTargetConfigProto` (text format; xla/stream_executor/device_description.proto)
  of `g`: what the GPU compiler reads of a device it cannot query (deviceless compilation,
  `jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=...)`).
  `cudnn`, `cuda`: the library versions the program is built for (those installed: the
  compiler picks kernels by them)."""
  major, minor = g.compute_capability
  return "\n".join([
      "gpu_device_info {",
      f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
      "  threads_per_block_limit: 1024",          # CUDA's limits for compute capability >= 2
      "  threads_per_warp: 32",
      "  shared_memory_per_block: 49152",          # 48 KB without opting in
      f"  shared_memory_per_block_optin: {g.shared_per_block_optin}",
      f"  shared_memory_per_core: {g.shared_per_sm}",
      "  threads_per_core_limit: 2048",
      f"  core_count: {g.sms}",
      f"  fpus_per_core: {g.fp32_per_sm}",
      "  block_dim_limit_x: 2147483647",
      "  block_dim_limit_y: 65535",
      "  block_dim_limit_z: 65535",
      f"  memory_bandwidth: {int(g.hbm_bytes_per_s)}",
      f"  l2_cache_size: {g.l2_bytes}",
      f"  clock_rate_ghz: {g.clock_hz / 1e9:.4f}",
      f"  device_memory_size: {g.usable_bytes}",
      "  registers_per_core_limit: 65536",         # 64K 32-bit registers per SM
      "  registers_per_block_limit: 65536",
      "}",
      'platform_name: "CUDA"',
      f"dnn_version_info {{ major: {cudnn[0]} minor: {cudnn[1]} patch: {cudnn[2]} }}",
      f"runtime_version {{ major: {cuda[0]} minor: {cuda[1]} }}",
      f'device_description_str: "{g.device_kind}"',
  ]) + "\n"


@dataclasses.dataclass(frozen=True)
class System:
  """A machine a hardware preset is made for: `--config=<name>` of every benchmark that has the
  preset. A TPU slice is named by MLPerf's system name (its TensorCores up to v5p: v3-2048 is
  1024 chips of 2 cores; v4-128 and v5p-128 are 64 chips of 2 cores, one JAX device each; v6e
  by its chips) and compiles for its `topology`; a GPU host by its GPUs."""
  name: str
  accelerator: str                 # a GENERATIONS key or a GPUS name
  devices: int                     # JAX devices
  topology: str | None = None      # what it compiles for (`--topology`, `stepmodel.topology`)

  @property
  def platform(self) -> str:
    """jax's platform name of its devices: "tpu" or "gpu"."""
    return "tpu" if self.accelerator in GENERATIONS else "gpu"


SYSTEMS = {s.name: s for s in (
    System("tpu-v3-2048", "v3", 2048, "v3:32x32"),
    System("tpu-v3-512", "v3", 512, "v3:16x16"),
    System("tpu-v4-128", "v4", 64, "v4:4x4x4"),
    System("tpu-v5p-128", "v5p", 64, "v5p:4x4x4"),
    System("tpu-v6e-64", "v6e", 64, "v6e:8x8"),
    # One 8-GPU host: the presets' batch per GPU is the same on H100 and H200.
    System("gpu-8xh100", "h100", 8, "h100:8"),
)}

# What the GPU presets set (`--xla_flags`): XLA's latency-hiding scheduler, which moves
# collectives to overlap the compute around them (JAX's GPU performance tips,
# https://docs.jax.dev/en/latest/gpu_performance_tips.html; NVIDIA's JAX containers set it too),
# and all-reduces combined only up to 128 KiB (the same tips list the combine thresholds): XLA
# sums a combined group in one contiguous buffer and slices each tensor back out after it, one
# kernel a tensor, while each all-reduce of its own runs on the collectives' stream beside the
# backward pass. On 8 x H200, modelled (2026-12-06): ResNet-50 884 -> 845 kernels, 52.1 ->
# 51.7 ms; SSD 29.5 -> 29.3; the Transformer 53.5 -> 52.4; the LM 28.2 -> 27.6 (docs/gpu.md).
GPU_XLA_FLAGS = ("--xla_gpu_enable_latency_hiding_scheduler=true "
                 "--xla_gpu_all_reduce_combine_threshold_bytes=131072")
# What TPU pod presets may set (`--libtpu_flags`): libtpu's asynchronous collectives, which
# start an all-gather (or a fused collective) before the kernels that do not need it and wait
# for it after them, so the weight-update sharding's all-gathers overlap compute. The flags as
# MaxText's TPU recipes and the Cloud TPU performance guide
# (https://cloud.google.com/tpu/docs/performance-guide) give them; docs/pod.md has their effect
# on the compiled programs.
TPU_ASYNC_COLLECTIVES = ("--xla_tpu_enable_async_collective_fusion=true "
                         "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
                         "--xla_tpu_overlap_compute_collective_tc=true "
                         "--xla_enable_async_all_gather=true")


@dataclasses.dataclass(frozen=True)
class Peak:
  """The peak matrix FLOP/s of one JAX device, with where the figure comes from; `flops` None
  when no figure is known for the device (`source` then says so: never a guess)."""
  device_kind: str
  flops: float | None
  source: str


def device_peak(platform: str, device_kind: str, cpu_devices: int = 1,
                cpu_flops: float | None = None) -> Peak:
  """The peak of one device of `platform` ("tpu", "gpu", "cpu") and `device_kind` (jax's):
  a TPU's from its generation (a core on v2/v3, a chip elsewhere, as JAX shows them), a GPU's
  from GPUS, a CPU's from `cpu_flops` (the host's measured matmul rate, shared by its
  `cpu_devices` simulated devices)."""
  if platform == "tpu":
    for gen in GENERATIONS.values():
      if gen.device_kind == device_kind:
        dev = per_device(gen, gen.megacore_default)
        return Peak(device_kind, dev["peak_flops"], f"{gen.name} bf16 peak per "
                    f"{'chip' if gen.megacore_default or gen.cores_per_chip == 1 else 'core'}: "
                    f"{gen.sources[0]}")
  elif platform == "gpu":
    for g in GPUS:
      if g.kind_pattern in device_kind:
        return Peak(device_kind, g.peak_flops, g.source)
  elif platform == "cpu" and cpu_flops:
    return Peak(device_kind, cpu_flops / max(cpu_devices, 1),
                f"measured on this host: {cpu_flops / 1e9:.1f} GFLOP/s of float32 matmul over "
                f"all its cores (not a published peak), shared by {cpu_devices} simulated "
                f"device(s)")
  return Peak(device_kind, None, f"no peak known for a {platform} device of kind "
              f"'{device_kind}' (stepmodel/accelerators.py lists the known ones); MFU not "
              f"reported")
