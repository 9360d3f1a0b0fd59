"""Beam search with a length penalty (Wu et al. 2016; tensor2tensor's beam search), in JAX.

Model-agnostic: `step_fn(tokens (B*K, 1), cache, step) -> (logits (B*K, V), cache)`. Hypotheses
are scored by log p / ((5 + length) / 6) ** alpha, length counting the end-of-sentence token.
Each step extends the K alive hypotheses by every token, keeps the 2K best extensions, moves
those that end the sentence to the finished set (the K best finished kept) and the K best
others stay alive; the loop stops when no alive hypothesis can beat the best finished one.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

NEG = -1e9


def length_penalty(length, alpha: float):
  return ((5.0 + length) / 6.0) ** alpha


def top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """`jax.lax.top_k` along the last axis (values descending, equal values by lower index first)
  as k rounds of max and first-index-of-max. `lax.top_k` has no sharding rule in jax 0.10's
  partitioner: it all-gathered every example's candidates to every device at every decoding step
  and each device ranked the whole batch; reductions along the last axis stay split by batch.
  For the small k of a beam it is also cheaper than a sort of each row."""
  n = x.shape[-1]
  index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  taken = jnp.zeros(x.shape, bool)
  values, indices = [], []
  for _ in range(k):
    best = jnp.max(jnp.where(taken, -jnp.inf, x), -1, keepdims=True)
    first = jnp.min(jnp.where((x == best) & ~taken, index, n), -1, keepdims=True)
    taken = taken | (index == first)
    values.append(best)
    indices.append(first)
  return jnp.concatenate(values, -1), jnp.concatenate(indices, -1)


def _gather(x: jax.Array, idx: jax.Array) -> jax.Array:
  """x (B, K, ...) -> x[b, idx[b, j]] for idx (B, J)."""
  return jax.vmap(lambda xb, ib: xb[ib])(x, idx)


def beam_search(step_fn: Callable[..., tuple[jax.Array, Any]], cache: Any, batch: int,
                beam: int, max_len: int, alpha: float, eos: int, pad: int = 0,
                valid: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Returns (sequences (B, max_len) ending with eos then pad, scores (B,)), the best of each
  example. Leaves of `cache` have a leading B*K dimension (example-major). `valid` (B,) marks
  real examples: padding rows of an eval batch do not hold up the early stop."""
  B, K = batch, beam

  def flat(x):
    return x.reshape((B * K,) + x.shape[2:])

  def unflat(x):
    return x.reshape((B, K) + x.shape[1:])

  state = {
      "step": jnp.array(0, jnp.int32),
      "alive_seq": jnp.full((B, K, max_len), pad, jnp.int32),
      # Only the first alive beam is real at the start (the others would duplicate it).
      "alive_logp": jnp.tile(jnp.array([0.0] + [NEG] * (K - 1), jnp.float32), (B, 1)),
      "fin_seq": jnp.full((B, K, max_len), pad, jnp.int32),
      "fin_score": jnp.full((B, K), NEG, jnp.float32),
      "cache": cache,
  }

  def not_done(s):
    # Later hypotheses score at most alive_logp / lp(max_len) (log p only falls, the penalty
    # only grows, for alpha >= 0): once the best finished beats that everywhere, it is final.
    bound = s["alive_logp"][:, 0] / length_penalty(max_len, alpha)
    done = s["fin_score"][:, 0] > bound
    if valid is not None:
      done |= ~valid
    return (s["step"] < max_len) & ~jnp.all(done)

  def body(s):
    i = s["step"]
    last = jax.lax.dynamic_index_in_dim(s["alive_seq"], jnp.maximum(i - 1, 0), 2, keepdims=False)
    prev = jnp.where(i == 0, pad, last)
    logits, cache = step_fn(flat(prev)[:, None], s["cache"], i)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    logp = logp.at[:, pad].set(NEG)                                  # never emit padding
    V = logp.shape[-1]
    cand = (s["alive_logp"][..., None] + unflat(logp)).reshape(B, K * V)
    top_logp, top_idx = top_k(cand, 2 * K)                          # (B, 2K)
    parent, token = top_idx // V, top_idx % V
    seqs = _gather(s["alive_seq"], parent)
    seqs = jax.lax.dynamic_update_index_in_dim(seqs, token, i, 2)
    ended = token == eos
    # Finished: the K best of the old finished and the candidates that just ended.
    new_fin = jnp.where(ended & (top_logp > NEG / 2), top_logp / length_penalty(i + 1.0, alpha),
                        NEG)
    all_score = jnp.concatenate([s["fin_score"], new_fin], 1)
    all_seq = jnp.concatenate([s["fin_seq"], seqs], 1)
    fin_score, fin_idx = top_k(all_score, K)
    fin_seq = _gather(all_seq, fin_idx)
    # Alive: the K best candidates that did not end.
    alive_logp, alive_idx = top_k(jnp.where(ended, NEG, top_logp), K)
    alive_seq = _gather(seqs, alive_idx)
    # Reorder the cache within each example (a batched gather: no data crosses the devices
    # that split the batch; flat indexing would all-gather the whole cache every step).
    parents = _gather(parent, alive_idx)
    cache = jax.tree.map(lambda c: flat(_gather(unflat(c), parents)), cache)
    return {"step": i + 1, "alive_seq": alive_seq, "alive_logp": alive_logp,
            "fin_seq": fin_seq, "fin_score": fin_score, "cache": cache}

  s = jax.lax.while_loop(not_done, body, state)
  # An example with no finished hypothesis returns its best alive one (cut at max_len).
  none = s["fin_score"][:, 0] <= NEG / 2
  best_alive = s["alive_logp"][:, 0] / length_penalty(max_len, alpha)
  seq = jnp.where(none[:, None], s["alive_seq"][:, 0], s["fin_seq"][:, 0])
  return seq, jnp.where(none, best_alive, s["fin_score"][:, 0])
