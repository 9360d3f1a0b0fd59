"""llama31_8b's data: rows of max_sequence_length + 1 tokens from MLCommons' preprocessed C4, or
from the grammar corpus written in the same format.

As the reference samples them (mlcommons/training, `small_llm_pretraining/nemo`: Megatron's
GPTDataset): the training documents are put end to end in a seeded order, cut into rows that
share one boundary token with their neighbours, and the rows are drawn in a seeded order, a new
one each epoch; every process computes the same order and keeps its share of each global batch.
The evaluation scores the first `eval_samples` rows of the validation documents in file order,
the same rows at every evaluation; each process takes a strided share, padded with rows of
`mask` 0 so every row counts once whatever the process count.

A row's inputs are its first max_sequence_length tokens and its targets its last; attention
runs across documents within a row and positions run from 0, as the reference trains.
"""

from __future__ import annotations

import os

import numpy as np

from benchmarks.common import grammar
from benchmarks.data import (
  Data,
  array_batches,
  described,
  num_steps,
  padded,
  process_indices,
)
from benchmarks.llama import indexed
from runtime import host, scratch
from runtime.errors import UserError

NAMES = {"inputs": ("batch", "length"), "targets": ("batch", "length"), "mask": ("batch",)}
# MLCommons' preprocessed C4 train file: 83,976,774,280 bytes of int32 ids (the sizes NVIDIA's
# v5.1 submission lists, `expected-mounts-8b.csv` in mlcommons/training_results_v5.1).
C4_TRAIN_TOKENS = 83_976_774_280 // 4
C4_VALIDATION_DOCUMENTS = 91205    # C4's first 91,205 validation documents (the file's name)


def describe(cfg, process_count: int = 1) -> Data | None:
  """C4's rows described, nothing read (compile-only runs); None for the grammar corpus, which
  is small and is read."""
  if cfg.dataset != "c4":
    return None
  row = ((cfg.max_sequence_length,), np.int32, f"ids:{cfg.vocab_size}")
  fields = {"inputs": row, "targets": row}
  return described("c4", (C4_TRAIN_TOKENS - 1) // cfg.max_sequence_length, cfg.eval_samples,
                   cfg, process_count, fields, fields, NAMES)


def grammar_dataset(cfg) -> str:
  """The grammar corpus (English sentence = its German translation, a document each) as the two
  indexed datasets C4 ships, in the cache; ids are words by first appearance, from 1. Written
  once per size, atomically."""
  folder = os.path.join(host.cache_root(), f"llama-grammar-{cfg.grammar_train_examples}-"
                                              f"{cfg.grammar_eval_examples}")

  def fill(tmp):
    splits = {indexed.TRAIN: grammar.corpus(cfg.grammar_train_examples, 1),
              indexed.VALIDATION: grammar.corpus(cfg.grammar_eval_examples, 2)}
    vocab: dict[str, int] = {}
    for name, (en, de) in splits.items():
      indexed.write(os.path.join(tmp, name), [
          np.array([vocab.setdefault(w, len(vocab) + 1) for w in f"{e} = {d}".split()], np.int32)
          for e, d in zip(en, de)])
  return scratch.publish(folder, indexed.VALIDATION + ".idx", fill)


def _rows(ds: indexed.Indexed, order: np.ndarray, cfg, what: str) -> indexed.Windows:
  rows = indexed.Windows(ds, order, cfg.max_sequence_length)
  if not len(rows):
    raise UserError(f"{what} has {ds.num_tokens:,} tokens, not one row of "
                    f"--max_sequence_length={cfg.max_sequence_length} + 1")
  return rows


def _batch(rows: np.ndarray) -> dict[str, np.ndarray]:
  return {"inputs": rows[:, :-1], "targets": rows[:, 1:]}


def make(cfg, process_index: int = 0, process_count: int = 1) -> Data:
  folder = grammar_dataset(cfg) if cfg.dataset == "grammar" else cfg.data_dir
  if not os.path.isdir(folder):
    raise UserError(f"--data_dir={folder} does not exist")
  train_ds = indexed.read(os.path.join(folder, indexed.TRAIN))
  valid_ds = indexed.read(os.path.join(folder, indexed.VALIDATION))
  for ds in (train_ds, valid_ds):       # every id, before run_start (once per file)
    indexed.check_ids(ds, cfg.vocab_size)
  G = cfg.global_batch_size
  ge = cfg.eval_batch_size or G
  local, local_eval = G // process_count, ge // process_count

  # Training rows: the count is the same in every epoch's document order (only whole rows).
  rows0 = _rows(train_ds, np.arange(train_ds.num_documents), cfg, f"{train_ds.prefix}.bin")
  steps = len(rows0) // G
  if steps == 0:
    raise UserError(f"{train_ds.prefix}.bin makes {len(rows0):,} rows of "
                    f"{cfg.max_sequence_length} + 1 tokens, fewer than one batch of {G}")

  def train(epoch: int):
    rng = np.random.default_rng([cfg.seed, epoch])
    rows = indexed.Windows(train_ds, rng.permutation(train_ds.num_documents),
                           cfg.max_sequence_length)
    order = rng.permutation(len(rows))[:steps * G]
    for ids in order.reshape(steps, process_count, local)[:, process_index]:
      yield _batch(rows.rows(ids))

  valid = _rows(valid_ds, np.arange(valid_ds.num_documents), cfg, f"{valid_ds.prefix}.bin")
  if len(valid) < cfg.eval_samples:
    raise UserError(f"{valid_ds.prefix}.bin makes {len(valid):,} rows of "
                    f"{cfg.max_sequence_length} + 1 tokens, fewer than --eval_samples="
                    f"{cfg.eval_samples}")
  mine = valid.rows(process_indices(cfg.eval_samples, process_index, process_count))
  eval_arrays = _batch(mine)
  eval_steps = num_steps(cfg.eval_samples, local_eval * process_count)

  def evaluate():
    return padded(array_batches(eval_arrays, local_eval), local_eval, eval_steps, eval_arrays)

  return Data(f"c4 ({folder})" if cfg.dataset == "c4" else "grammar (C4's format)",
              steps * G, cfg.eval_samples, steps, eval_steps, train, evaluate, NAMES,
              subset=_subset(train_ds, valid_ds) if cfg.dataset == "c4" else "")


def _subset(train_ds: indexed.Indexed, valid_ds: indexed.Indexed) -> str:
  """"" for MLCommons' C4 as published, else the line a run says and logs (`./run.sh prepare
  c4 --subset` accepts a part)."""
  parts = []
  if train_ds.num_tokens != C4_TRAIN_TOKENS:
    parts.append(f"train {train_ds.num_tokens:,} of {C4_TRAIN_TOKENS:,} tokens")
  if valid_ds.num_documents != C4_VALIDATION_DOCUMENTS:
    parts.append(f"validation {valid_ds.num_documents:,} of {C4_VALIDATION_DOCUMENTS:,} "
                 f"documents")
  return ("" if not parts else "c4 is not the published dataset: " + ", ".join(parts)
          + " (a subset: its results are not comparable with full-dataset runs)")
