"""`--state_layouts=auto`: the train state kept in the memory layouts its train step reads.

On a CPU the compiler chooses the default layouts, so here the test asks for column-major ones
(`step.requested_layout`, what the compiler gets instead of `Layout.AUTO`): a run only works if
every path the state takes (its initialization, the train step, the eval step, a checkpoint
written and read back) follows the program's layouts, and its numbers are the default
layouts' run's.
"""

import dataclasses

import jax
import numpy as np
import pytest
from jax.experimental.layout import Layout

from benchmarks import registry
from benchmarks.config import validate_common
from harness import run as runs
from harness import step as step_lib
from harness.build import build
from harness.checkpoints import Checkpoints
from runtime.errors import UserError


def _column_major(x):
  return Layout(major_to_minor=tuple(reversed(range(len(x.shape)))))


def _run(cfg, entry, steps: int = 2):
  built = build(runs.make(entry, cfg))
  batches = iter(built.task.data.train(0))
  state = built.state
  for _ in range(steps):
    state, _ = built.program.train(
        state, step_lib.global_batch(next(batches), built.program.batch_shardings))
  return built, state


def _eval(built, state):
  return step_lib.evaluate(built.program, state, [built.examples[1]])


@pytest.mark.parametrize("optimizations", ["distributed_eval",
                                           pytest.param("none", marks=pytest.mark.slow)])
def test_the_state_in_other_layouts_trains_evaluates_and_resumes_like_the_default(
    monkeypatch, tmp_path, optimizations):
  entry = registry.BENCHMARKS["resnet"]
  base = dataclasses.replace(entry.config().PRESETS["tiny"], dtype="float64",
                             optimizations=optimizations)
  with jax.enable_x64(True):
    default, d_state = _run(base, entry)
    monkeypatch.setattr(step_lib, "requested_layout", _column_major)
    built, state = _run(dataclasses.replace(base, state_layouts="auto"), entry)
    program = built.program

    kernels = [x for x in jax.tree.leaves(program.state_shapes["params"]) if x.ndim == 4]
    assert kernels and all(x.format.layout.major_to_minor == (3, 2, 1, 0) for x in kernels)
    assert jax.tree.map(lambda x: x.format, built.state) == program.state_shardings
    assert jax.tree.map(lambda x: x.format, state) == program.state_shardings
    for a, b in zip(jax.tree.leaves(jax.device_get(state)), jax.tree.leaves(
        jax.device_get(d_state))):
      np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert _eval(built, state) == pytest.approx(_eval(default, d_state), rel=1e-12)

    ckpt = Checkpoints(str(tmp_path / "checkpoints"), asynchronous=False)
    ckpt.save(state, 2, {})
    restored, step, _ = ckpt.restore(program.state_shapes, {}, last_step=3)
    ckpt.close()
    assert step == 2
    assert jax.tree.map(lambda x: x.format, restored) == program.state_shardings
    batch = step_lib.global_batch(next(iter(built.task.data.train(1))), program.batch_shardings)
    after, _ = program.train(restored, batch)
    straight, _ = program.train(state, batch)
    for a, b in zip(jax.tree.leaves(jax.device_get(after)),
                    jax.tree.leaves(jax.device_get(straight))):
      np.testing.assert_array_equal(a, b)


def test_an_unknown_state_layouts_value_is_bad_input():
  cfg = dataclasses.replace(registry.BENCHMARKS["resnet"].config().PRESETS["tiny"],
                            state_layouts="tiled")
  with pytest.raises(UserError, match=r"--state_layouts=tiled: choose one of default, auto"):
    validate_common(cfg)
