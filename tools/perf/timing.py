"""Timing programs against each other on a noisy machine: interleaved rounds and per-round ratios.

On a shared host the same program's wall time drifts by more than the differences worth
measuring. So what is compared takes turns, round by round: `alternate` (A B, then B A, ...) or
`rotate` (A B C, then B C A, ...), so slow drift in the machine's load falls on all alike and
no way always runs first. A comparison is the median of the per-round ratios (each round's
timings are adjacent in time), with their quartiles as its spread. `./run.sh perf`, `./run.sh
sweep` and `./run.sh ablate` time with these.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")


def order(ways: Sequence[T], round_index: int, how: str = "alternate") -> list[T]:
  """The ways' order in round `round_index`: `alternate` reverses every other round, `rotate`
  starts each round one way later."""
  ways = list(ways)
  if how == "alternate":
    return ways if round_index % 2 == 0 else ways[::-1]
  if how == "rotate":
    k = round_index % len(ways)
    return ways[k:] + ways[:k]
  raise ValueError(f"order is 'alternate' or 'rotate', not {how!r}")


def take_turns(ways: dict[str, Callable[[], Any]], rounds: int, how: str = "alternate",
               after_round: Callable[[int, dict[str, list]], None] | None = None
               ) -> dict[str, list]:
  """Calls each way once per round, in `order`; returns each way's results, one per round.
  `after_round(round_index, results)`: e.g. a progress line."""
  results: dict[str, list] = {name: [] for name in ways}
  for r in range(rounds):
    for name in order(list(ways), r, how):
      results[name].append(ways[name]())
    if after_round is not None:
      after_round(r, results)
  return results


def quartiles(xs: Sequence[float]) -> list[float]:
  """[25th, 75th] percentiles (inclusive method): the spread of per-round figures."""
  if len(xs) < 2:
    return [xs[0], xs[0]]
  q = statistics.quantiles(xs, n=4, method="inclusive")
  return [q[0], q[2]]


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
  """Per-round ratios of two ways timed in the same rounds."""
  return [a / b for a, b in zip(numerators, denominators)]
