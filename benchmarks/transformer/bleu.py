"""Uncased corpus BLEU (sacrebleu) from n-gram statistics that add up across shards.

Corpus BLEU is a function of sums over sentences (matched and total n-grams of each order,
hypothesis and reference lengths), so each process scores the sentences it decoded, the sums
are reduced across processes, and the score comes from the totals.
"""

from __future__ import annotations

from sacrebleu.metrics import BLEU

ORDER = 4
KEYS = (("sys_len", "ref_len") + tuple(f"correct_{n}" for n in range(1, ORDER + 1))
        + tuple(f"total_{n}" for n in range(1, ORDER + 1)))
_METRIC = BLEU(lowercase=True)   # 13a tokenization, exponential smoothing (sacrebleu defaults)


def stats(hypotheses: list[str], references: list[str]) -> dict[str, float]:
  """The additive statistics of these sentences (all zero for none)."""
  if not hypotheses:
    return {k: 0.0 for k in KEYS}
  s = _METRIC.corpus_score(hypotheses, [references])
  out = {"sys_len": float(s.sys_len), "ref_len": float(s.ref_len)}
  for n in range(ORDER):
    out[f"correct_{n + 1}"] = float(s.counts[n])
    out[f"total_{n + 1}"] = float(s.totals[n])
  return out


def score(totals: dict[str, float]) -> float:
  """BLEU (0-100) from summed statistics."""
  if totals.get("sys_len", 0) == 0:
    return 0.0
  return BLEU.compute_bleu(
      [int(totals[f"correct_{n}"]) for n in range(1, ORDER + 1)],
      [int(totals[f"total_{n}"]) for n in range(1, ORDER + 1)],
      int(totals["sys_len"]), int(totals["ref_len"]), smooth_method=_METRIC.smooth_method,
      smooth_value=_METRIC.smooth_value).score
