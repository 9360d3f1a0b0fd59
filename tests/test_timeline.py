"""The loop's timeline: blocks and their MLPerf metadata in epochs or in samples, and where a
resumed run starts (pure functions: no devices, no compilation)."""

import dataclasses

import pytest

from benchmarks.config import Common
from benchmarks.task import Spec
from harness.timeline import check_cadence, timeline
from logs.mlperf import C
from runtime.errors import UserError

EPOCHS = Spec("resnet", ("1.0.0",), "top-1", "max_epochs")
SAMPLES = Spec("llama31_8b", ("5.1.0",), "log perplexity", "max_epochs", higher_is_better=False,
               cadence="samples")


def _cfg(**kw):
  return dataclasses.replace(Common(global_batch_size=32), **kw)


def test_epoch_blocks_follow_eval_every_and_eval_epochs():
  blocks = timeline(_cfg(max_epochs=5, eval_every=2), EPOCHS, steps_per_epoch=10)
  assert [(b.first_step, b.steps) for b in blocks] == [(0, 20), (20, 20), (40, 10)]
  assert [b.start for b in blocks] == [{C.FIRST_EPOCH_NUM: 1, C.EPOCH_COUNT: 2},
                                       {C.FIRST_EPOCH_NUM: 3, C.EPOCH_COUNT: 2},
                                       {C.FIRST_EPOCH_NUM: 5, C.EPOCH_COUNT: 1}]
  assert [b.at for b in blocks] == [{C.EPOCH_NUM: 2}, {C.EPOCH_NUM: 4}, {C.EPOCH_NUM: 5}]
  listed = timeline(_cfg(max_epochs=8, eval_epochs=(3, 5)), EPOCHS, steps_per_epoch=10)
  assert [b.at[C.EPOCH_NUM] for b in listed] == [3, 5, 8]


def test_sample_blocks_carry_samples_count_and_fractional_epochs():
  cfg = _cfg(max_epochs=2, eval_every_samples=32 * 4)
  blocks = timeline(cfg, SAMPLES, steps_per_epoch=10)
  assert [(b.first_step, b.steps) for b in blocks] == [(0, 4), (4, 4), (8, 4), (12, 4), (16, 4)]
  assert blocks[0].start == {C.SAMPLES_COUNT: 0}
  assert blocks[1].at == {C.EPOCH_NUM: 0.8, C.SAMPLES_COUNT: 256}
  assert blocks[-1].stop == {C.SAMPLES_COUNT: 640}


def test_a_resumed_run_starts_where_its_checkpoint_ended():
  # A run of 1 epoch (10 steps) resumed with --max_epochs=2 and 4-step blocks: the first block
  # runs steps 10..11, up to the next evaluation point, instead of skipping or repeating steps.
  blocks = timeline(_cfg(max_epochs=2, eval_every_samples=32 * 4), SAMPLES, 10, start=10)
  assert [(b.first_step, b.steps) for b in blocks] == [(10, 2), (12, 4), (16, 4)]
  assert blocks[0].start == {C.SAMPLES_COUNT: 320}
  assert timeline(_cfg(max_epochs=2), EPOCHS, 10, start=20) == []


def test_cadence_flags_that_do_not_apply_are_refused():
  with pytest.raises(UserError, match="evaluates after epochs"):
    check_cadence(_cfg(eval_every_samples=64), EPOCHS)
  with pytest.raises(UserError, match="evaluates every --eval_every_samples"):
    check_cadence(_cfg(eval_epochs=(2,)), SAMPLES)
  with pytest.raises(UserError, match="not a multiple of --global_batch_size=32"):
    check_cadence(_cfg(eval_every_samples=48), SAMPLES)
