# ruff: noqa: E501  (HLO lines as the compiler prints them)
"""GPU hosts as topologies and the GPU step model, without JAX's CUDA plugin: topology names and
their errors, the target configs, the FLOPs of the GPU compiler's library calls (lines as
XLA's GPU compiler printed them for an H100 with jax 0.10.2, trimmed of metadata), NCCL's
collectives and the fit. `tests/test_gpu_compile.py` compiles the presets (`./run.sh test
--gpu`)."""

import dataclasses
import math

import pytest

from runtime.errors import UserError
from stepmodel import accelerators, gpu, hlo, kernels, steptime, topology

H100 = accelerators.gpu("h100")


@pytest.mark.parametrize("name,hosts,per_host", [("h100:8", 1, 8), ("h200:8", 1, 8),
                                                 ("b200:8", 1, 8), ("h100:4x8", 4, 8),
                                                 ("h200:1", 1, 1)])
def test_gpu_topologies_parse(name, hosts, per_host):
  t = topology.parse(name)
  assert (t.platform, t.hosts, t.chips, t.num_devices) == ("gpu", hosts, (hosts, per_host),
                                                           hosts * per_host)
  assert t.generation == name.split(":")[0]


@pytest.mark.parametrize("name,says", [
    ("x100:8", "unknown GPU 'x100'"),
    ("a100:8", "unknown GPU 'a100'"),          # a peak, but no target config to compile for
    ("h100:9", "1 to 8 GPUs"),
    ("h100:0", "1 to 8 GPUs"),
    ("h100:0x8", "at least one host"),
    ("h100:2x2x2", "expected <generation>"),
])
def test_bad_gpu_topologies_are_one_line(name, says):
  with pytest.raises(UserError, match=says) as e:
    topology.parse(name)
  assert "\n" not in str(e.value)


def test_a_mesh_must_cut_hosts_at_axis_boundaries():
  four = topology.parse("h100:4x8")
  topology.check_divides(four, (("data", 32),))
  topology.check_divides(four, (("data", 4), ("model", 8)))
  topology.check_divides(four, (("data", 16), ("model", 2)))
  three = topology.parse("h100:3x8")
  with pytest.raises(UserError, match="axis boundaries"):
    topology.check_divides(three, (("data", 4), ("model", 6)))   # 6 GPUs straddle two hosts
  topology.check_divides(topology.parse("h100:8"), (("a", 2), ("b", 4)))


def test_without_the_cuda_plugin_a_gpu_topology_names_the_extra(monkeypatch):
  monkeypatch.setattr(topology, "_versions", lambda: None)
  with pytest.raises(UserError, match=r"install cuda12"):
    topology.devices(topology.parse("h100:8"))


def test_target_configs_hold_the_table_figures():
  text = accelerators.target_config(H100, (9, 8, 0), (12, 9))
  assert "cuda_compute_capability { major: 9 minor: 0 }" in text
  assert "core_count: 132" in text
  assert f"device_memory_size: {H100.usable_bytes}" in text
  assert "memory_bandwidth: 3350000000000" in text
  assert 'device_description_str: "NVIDIA H100 80GB HBM3"' in text
  assert "dnn_version_info { major: 9 minor: 8 patch: 0 }" in text
  # The clock is the one the peak is quoted at: SMs x 4,096 FLOP per clock x clock = peak.
  assert H100.sms * 4096 * H100.clock_hz == pytest.approx(H100.peak_flops)
  for g in accelerators.GPUS:
    if g.compiles:
      assert g.usable_bytes < g.memory_bytes and g.nvlink_bytes_per_s and g.sources


# --- the library calls' FLOPs ----------------------------------------------------------------

_CONV = ('window={size=3x3 stride=2x2}, dim_labels=b01f_o01i->b01f, '
         'custom_call_target="__cudnn$conv%s"')
HLO = f"""
ENTRY %main (x: bf16[32,29,29,64], w: bf16[128,3,3,64], dy: bf16[32,14,14,128], a: bf16[1024,512], b: bf16[4096,512], q: bf16[16,128,8,64]) -> bf16[1] {{
  %x = bf16[32,29,29,64]{{3,2,1,0}} parameter(0)
  %w = bf16[128,3,3,64]{{3,2,1,0}} parameter(1)
  %dy = bf16[32,14,14,128]{{3,2,1,0}} parameter(2)
  %a = bf16[1024,512]{{1,0}} parameter(3)
  %b = bf16[4096,512]{{1,0}} parameter(4)
  %q = bf16[16,128,8,64]{{3,2,1,0}} parameter(5)
  %fwd = (bf16[32,14,14,128]{{3,2,1,0}}, u8[0]{{0}}) custom-call(%x, %w), {_CONV % 'Forward'}
  %bwf = (bf16[128,3,3,64]{{3,2,1,0}}, u8[0]{{0}}) custom-call(%x, %dy), {_CONV % 'BackwardFilter'}
  %bwi = (bf16[32,29,29,64]{{3,2,1,0}}, u8[0]{{0}}) custom-call(%dy, %w), {_CONV % 'BackwardInput'}
  %gemm = (bf16[1024,4096]{{1,0}}, s8[4194304]{{0}}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", backend_config={{"gemm_backend_config":{{"alpha_real":1,"beta":0,"dot_dimension_numbers":{{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}}}}
  %attn = (bf16[16,8,128,64]{{3,1,2,0}}, f32[16,8,128]{{2,1,0}}, u8[0]{{0}}) custom-call(%q, %q, %q), custom_call_target="__cudnn$fmhaSoftmax", backend_config={{"cudnn_fmha_backend_config": {{"intermediate_tensor_shape": {{"element_type": "BF16", "dimensions": ["16", "8", "128", "128"], "tuple_shapes": []}}, "mask_type": "CAUSAL", "bmm1_dot_dimension_numbers": {{"lhs_contracting_dimensions": ["3"], "rhs_contracting_dimensions": ["3"], "lhs_batch_dimensions": ["0", "2"], "rhs_batch_dimensions": ["0", "2"]}}}}}}
  %attn_bwd = (bf16[16,8,128,64]{{3,1,2,0}}, bf16[16,8,128,64]{{3,1,2,0}}, bf16[16,8,128,64]{{3,1,2,0}}, u8[0]{{0}}) custom-call(%q, %q, %q), custom_call_target="__cudnn$fmhaSoftmaxBackward", backend_config={{"cudnn_fmha_backend_config": {{"intermediate_tensor_shape": {{"element_type": "BF16", "dimensions": ["16", "8", "128", "128"], "tuple_shapes": []}}, "mask_type": "NO_MASK"}}}}
  ROOT %r = bf16[1]{{0}} constant({{0}})
}}
"""


def _by_name():
  comps, _ = hlo.parse(HLO)
  shapes = kernels.shapes_of((comps, None))
  return {i["name"]: hlo.library_flops(i, shapes) for body in comps.values() for i in body}


def test_cudnn_convolutions_of_each_kind_count_the_forward_convolution():
  flops = _by_name()
  # Independently: 14 x 14 outputs of a stride-2 3x3 window over 29 x 29 (no padding: every
  # window position reads the input), 64 in and 128 out channels, a batch of 32.
  forward = 2 * 32 * 14 * 14 * 128 * 3 * 3 * 64
  assert flops["fwd"] == forward
  assert flops["bwf"] == forward
  assert flops["bwi"] == forward


def test_cublas_gemm_and_cudnn_attention_flops():
  flops = _by_name()
  assert flops["gemm"] == 2 * 1024 * 4096 * 512
  scores = 16 * 8 * 128 * 128
  assert flops["attn"] == 2 * 2 * scores * 64 * 0.5        # Q K^T and P V, causal: half
  assert flops["attn_bwd"] == 2 * 5 * scores * 64           # five matmuls, no mask
  assert flops["x"] == 0                                   # not a library call


def test_library_calls_are_matrix_kernels():
  listed = {k.name: k for k, _ in kernels.kernels(HLO, mxu=1)}
  assert listed["gemm"].mxu_flops == listed["gemm"].flops == 2 * 1024 * 4096 * 512
  # Bytes: operands and results (the cuBLAS workspace too: s8[4194304]).
  assert listed["gemm"].bytes == 2 * (1024 * 512 + 4096 * 512 + 1024 * 4096) + 4194304


# --- NCCL ------------------------------------------------------------------------------------

def _coords(hosts, per_host):
  return [(i % per_host, i // per_host, 0, 0) for i in range(hosts * per_host)]


def test_an_all_reduce_within_a_host_is_a_ring_over_nvlink():
  B = 1 << 30
  op = {"kind": "all-reduce", "bytes": B}
  got = gpu.price(op, [list(range(8))], H100, _coords(1, 8))["seconds"]
  want = (2 * 7 / 8 * B / H100.nvlink_bytes_per_s + 2 * 7 * H100.nvlink_latency_s
          + H100.collective_latency_s)
  assert got == pytest.approx(want)


def test_across_hosts_the_network_phase_carries_a_host_share():
  B = 1 << 30
  c = _coords(4, 8)
  op = {"kind": "all-reduce", "bytes": B}
  got = gpu.price(op, [list(range(32))], H100, c)["seconds"]
  nv, net = H100.nvlink_bytes_per_s, H100.network_bytes_per_s
  # Reduce-scatter within the host, all-reduce of B/8 across 4 hosts, all-gather back.
  want = 2 * (7 / 8 * B / nv + 7 * H100.nvlink_latency_s
              + 3 / 4 * B / 8 / net + 3 * H100.network_latency_s) + H100.collective_latency_s
  assert got == pytest.approx(want)
  # One GPU per host on each of 8 rails: the whole buffer over the network.
  rails = [[h * 8 + i for h in range(4)] for i in range(8)]
  alone = gpu.price(op, rails, H100, c)["seconds"]
  assert alone == pytest.approx(2 * (3 / 4 * B / net + 3 * H100.network_latency_s)
                                + H100.collective_latency_s)
  assert alone > got


def test_an_all_gather_and_a_permute_across_hosts():
  c = _coords(2, 8)
  gathered = 8 << 20
  ag = gpu.price({"kind": "all-gather", "bytes": gathered}, [list(range(16))], H100, c)
  nv, net = H100.nvlink_bytes_per_s, H100.network_bytes_per_s
  # The cheaper order: across hosts first on the whole size, or within the host first.
  orders = [1 / 2 * gathered / net + H100.network_latency_s
            + 7 / 8 * gathered / 2 / nv + 7 * H100.nvlink_latency_s,
            7 / 8 * gathered / nv + 7 * H100.nvlink_latency_s
            + 1 / 2 * gathered / 8 / net + H100.network_latency_s]
  assert ag["seconds"] == pytest.approx(min(orders) + H100.collective_latency_s)
  near = gpu.price({"kind": "collective-permute", "bytes": gathered}, [[0, 1]], H100, c)
  far = gpu.price({"kind": "collective-permute", "bytes": gathered}, [[0, 8]], H100, c)
  assert far["seconds"] / near["seconds"] > 5


# --- the model and its fit -------------------------------------------------------------------

def _program(kernel_list):
  seq = [{"kind": "kernel", "kernel": dataclasses.asdict(k)} for k in kernel_list]
  return {"entry": "main", "computations": {"main": seq}}


def _prepared(kernel_list, g=H100):
  return gpu.Prepared(g, 1, _program(kernel_list), False, ())


def _k(name, flops, nbytes):
  return kernels.Kernel(name, "fusion", flops, flops, nbytes, None)


def test_each_kernel_takes_its_slower_side_plus_the_overhead():
  p = _prepared([_k("gemm", 989e9, 1e6), _k("copy", 0, 3.35e9)])
  cal = accelerators.Calibration(kernel_overhead_s=5e-6, hbm_efficiency=0.5,
                                 matrix_efficiency=0.5)
  m = gpu.evaluate(p, calibration=cal)
  assert m["step_s"] == pytest.approx(2e-3 + 2e-3 + 2 * 5e-6)
  assert m["compute_s"] == pytest.approx(2e-3) and m["memory_s"] == pytest.approx(
      2e-3 + 1e6 / (3.35e12 * 0.5))
  # The fit's fast sum is the same as the simulated schedule.
  assert gpu._step_only(p, "schedule", cal)["step_s"] == pytest.approx(m["step_s"])


def test_the_fit_recovers_the_constants_that_made_the_steps():
  truth = accelerators.Calibration(kernel_overhead_s=6e-6, hbm_efficiency=0.7,
                                   matrix_efficiency=0.6)
  programs = [_prepared([_k(f"g{i}", 989e9 * a, 1e6) for i in range(n)]
                        + [_k(f"c{i}", 0, 3.35e9 * b) for i in range(m)])
              for a, b, n, m in ((1.0, 0.1, 10, 10), (0.01, 0.05, 400, 200),
                                 (0.2, 0.001, 50, 3000), (0.0, 0.3, 0, 40))]
  pairs = [(p, gpu.evaluate(p, calibration=truth)["step_s"]) for p in programs]
  cal = gpu.fit(pairs, "synthetic", ["a", "b", "c", "d"])
  for p, measured in pairs:
    assert gpu.evaluate(p, calibration=cal)["step_s"] == pytest.approx(measured, rel=0.01)
  assert cal.matrix_efficiency == pytest.approx(0.6, rel=0.05)
  assert cal.hbm_efficiency == pytest.approx(0.7, rel=0.05)
  assert math.isfinite(cal.kernel_overhead_s) and cal.points == ("a", "b", "c", "d")


def test_the_tpu_fit_is_unchanged_by_the_gpu_constant():
  """A TPU calibration's matrix_efficiency stays 1: the TPU model has no such constant."""
  assert "matrix_efficiency" not in steptime.FIT_RANGES
  assert accelerators.GENERATIONS["v3"].calibration.matrix_efficiency == 1.0


def test_the_target_config_reader_reads_nested_fields():
  from tools.perf import target_config
  got = target_config.fields(accelerators.target_config(H100, (9, 8, 0), (12, 9)))
  assert got["gpu_device_info.cuda_compute_capability.major"] == "9"
  assert got["gpu_device_info.core_count"] == "132"
  assert got["dnn_version_info.minor"] == "8"
  assert got["device_description_str"] == '"NVIDIA H100 80GB HBM3"'
