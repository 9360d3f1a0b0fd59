"""Throughput and MFU: each benchmark's analytic model FLOPs against an independent count (the
dots and convolutions of its compiled forward pass, as `stepmodel.hlo` reads them), the rates, the
peak table, and the CPU's measured peak kept once per host."""

import json

import jax
import jax.numpy as jnp
import pytest

from benchmarks.lm.model import LanguageModel
from benchmarks.resnet.model import ResNet
from benchmarks.ssd.model import SSD
from benchmarks.transformer.model import Transformer
from harness import throughput
from stepmodel import accelerators, hlo, kernels


def _compiled_flops(f, *args) -> float:
  """FLOPs of every dot and convolution of f's optimized program, loops times their trips."""
  text = jax.jit(f).lower(*args).compile().as_text()
  parsed = hlo.parse(text)
  shapes = kernels.shapes_of(parsed)
  runs, _ = hlo.multipliers(text, None, parsed)
  return sum(hlo.flops(ins, shapes) * runs.get(comp, 1) for comp, body in parsed[0].items()
             for ins in body)


def _forward(model, *inputs, **kw):
  variables = model.init(jax.random.PRNGKey(0), *inputs, **kw)
  return _compiled_flops(lambda v, *x: model.apply(v, *x, **kw), variables, *inputs)


def test_resnet_forward_flops():
  """A bottleneck ResNet-14 of width 8 at 32 px: stem, 4 stages (strided 3x3 and projected
  residuals), the classifier; zero padding not counted."""
  model = ResNet(14, 8, 10, None)
  x = jnp.zeros((2, 32, 32, 3))
  assert _forward(model, x, train=False) == 2 * model.forward_flops(32)


@pytest.mark.parametrize("size, extra, depth, width, classes, boxes", [
    (128, (2, 2, 2, 2), 18, 8, 5, (4, 6, 6, 4, 4)),
    pytest.param(300, (2, 2, 2, 0, 0), 34, 16, 81, (4, 6, 6, 6, 4, 4),   # MLPerf's maps 38 .. 3, 1
                 marks=pytest.mark.slow),
])
def test_ssd_forward_flops(size, extra, depth, width, classes, boxes):
  model = SSD(classes, boxes, extra_blocks=extra, depth=depth, width=width)
  x = jnp.zeros((1, size, size, 3), jnp.uint8)
  assert _forward(model, x, train=False) == model.forward_flops(size)


def test_transformer_forward_flops():
  """Encoder over 12 source tokens, decoder over 10 target tokens (self- and cross-attention:
  every query-key pair, masked ones included), logits over the padded vocab."""
  model = Transformer(256, 200, 2, 64, 128, 4, 16)
  s, t = jnp.ones((2, 12), jnp.int32), jnp.ones((2, 10), jnp.int32)
  assert _forward(model, s, t) == 2 * model.forward_flops(12, 10)


def test_lm_forward_flops():
  model = LanguageModel(256, 200, 2, 64, 128, 4, 16)
  t = jnp.ones((2, 10), jnp.int32)
  assert _forward(model, t) == 2 * model.forward_flops(10)


def test_the_transformer_formula_is_six_n_per_token_plus_attention():
  """The count reduces to the textbook one: 2 x matmul parameters per token, plus 4 x length x
  d per token per attention (Kaplan et al. 2020, table 1, forward)."""
  d, f, n, v, L = 64, 256, 3, 512, 32
  model = LanguageModel(v, v, n, d, f, 4, 16)
  params = n * (4 * d * d + 2 * d * f) + d * v
  assert model.forward_flops(L) == 2 * params * L + n * 4 * L * L * d


def test_rates():
  peak = accelerators.Peak("TPU v3", 61.5e12, "test")
  t = throughput.Throughput(global_batch=64, devices=8, flops_per_step=8 * 61.5e12 * 0.5,
                            peak=peak, weight_unit="tokens")
  r = t.rates(2.0, weight=1000.0)
  assert r["examples_per_s"] == 32 and r["examples_per_s_per_device"] == 4
  assert r["tokens_per_s"] == 500 and r["tokens_per_s_per_device"] == 62.5
  assert r["model_tflops_per_s_per_device"] == pytest.approx(61.5 * 0.25)
  assert r["mfu"] == pytest.approx(0.25)
  assert "MFU 25.0%" in t.line(2.0, 1000.0) and "62 tokens/s/device" in t.line(2.0, 1000.0)
  unknown = throughput.Throughput(64, 8, 1e12, accelerators.Peak("x", None, "no peak"), "examples")
  assert unknown.rates(1.0)["mfu"] is None and unknown.rates(1.0)["tokens_per_s"] is None
  s = unknown.summary(1.0)
  assert s["peak_source"] == "no peak" and s["mfu"] is None and "MFU" not in unknown.line(1.0)
  assert t.rates(None)["examples_per_s"] is None


@pytest.mark.parametrize("platform, kind, flops", [
    ("tpu", "TPU v3", 61.5e12),                  # one TensorCore: half of a 123 TFLOPS chip
    ("tpu", "TPU v4", 275e12),                   # megacore: the chip
    ("tpu", "TPU v5 lite", 197e12),
    ("tpu", "TPU v5", 459e12),
    ("tpu", "TPU v6 lite", 918e12),
    ("gpu", "NVIDIA H100 80GB HBM3", 989e12),
    ("gpu", "NVIDIA H100 PCIe", 756e12),
    ("gpu", "NVIDIA H200", 989e12),
    ("gpu", "NVIDIA A100-SXM4-80GB", 312e12),
    ("gpu", "NVIDIA B200", 2.25e15),
])
def test_peak_table(platform, kind, flops):
  peak = accelerators.device_peak(platform, kind)
  assert peak.flops == flops and peak.source


def test_an_unknown_device_is_named_not_guessed():
  peak = accelerators.device_peak("gpu", "NVIDIA GeForce RTX 4090")
  assert peak.flops is None and "NVIDIA GeForce RTX 4090" in peak.source
  assert accelerators.device_peak("cpu", "cpu").flops is None       # no measurement given
  shared = accelerators.device_peak("cpu", "cpu", cpu_devices=8, cpu_flops=200e9)
  assert shared.flops == 25e9 and "measured" in shared.source


def test_the_cpu_peak_is_measured_once_per_host(tmp_path, monkeypatch):
  monkeypatch.setenv("MESHPERF_CACHE", str(tmp_path))
  calls = []
  monkeypatch.setattr(throughput, "measure_cpu_flops", lambda: calls.append(1) or 123e9)
  assert throughput.cpu_flops() == 123e9 and throughput.cpu_flops() == 123e9
  assert calls == [1]
  saved = json.loads((tmp_path / "cpu-peak.json").read_text())
  assert saved["flops"] == 123e9 and saved["host"]
  saved["host"] = "another machine"              # another host's figure is not used
  (tmp_path / "cpu-peak.json").write_text(json.dumps(saved))
  assert throughput.cpu_flops() == 123e9 and calls == [1, 1]


def test_measure_cpu_flops_is_a_rate():
  rate = throughput.measure_cpu_flops(n=128, repeats=2)
  assert 1e6 < rate < 1e15
