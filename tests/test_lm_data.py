"""Language-model data: lm1b in the tfds ArrayRecord format (built here with tfds's own lm1b
builder, read without TensorFlow), plain text files, splitting and packing, per-process shares,
and eval tokens counted exactly once."""

import collections
import dataclasses
import os

import numpy as np
import pytest

from benchmarks.common import tokenizer as tok_lib
from benchmarks.common.tokenizer import EOS
from benchmarks.lm import data as data_lib
from benchmarks.lm.config import PRESETS, validate
from runtime.errors import UserError

TRAIN = data_lib.grammar_lines(400, 5, True)
EVAL = data_lib.grammar_lines(40, 6, True)


def _cfg(tmp_path, **kw):
  base = dict(global_batch_size=8, eval_batch_size=16, vocab_size=128, max_sequence_length=64,
              tokenizer=str(tmp_path / "spm.model"))
  base.update(kw)
  return dataclasses.replace(PRESETS["tiny"], **base)


def _write_text(folder, train, evals):
  os.makedirs(folder, exist_ok=True)
  for name, lines in (("train.txt", train), ("eval.txt", evals)):
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
      f.write("".join(line + "\n" for line in lines))


# tests/test_bad_input.py reads it from here.
_write_lm1b = data_lib.write_lm1b


def _eval_rows(data):
  """Real eval rows (tokens, segment) as tuples, and the real token count."""
  rows, tokens = [], 0
  for b in data.eval():
    for t, s, m in zip(b["tokens"], b["segment"], b["mask"]):
      if m:
        rows.append(tuple(t) + tuple(s))
        tokens += int((s > 0).sum())
    assert b["tokens"].shape[0] == 16
  return rows, tokens


def _check(data, tok, train, evals, max_len):
  want_eval = sum(len(s) for s in tok.encode(evals))
  rows, tokens = _eval_rows(data)
  assert tokens == want_eval and len(rows) == data.num_eval
  batch = next(iter(data.train(0)))
  assert set(batch) == set(data_lib.FIELDS) and batch["tokens"].shape == (8, max_len)
  # Every segment is a sentence, or a piece of one: positions from 0; a segment shorter than a
  # row is a whole sentence or the last piece of one, so it ends with end-of-sentence.
  train_ids = [s for s in tok.encode(train)]
  for t, s, p in zip(batch["tokens"], batch["segment"], batch["position"]):
    for k in range(1, s.max() + 1):
      ids = list(t[s == k])
      assert list(p[s == k]) == list(range(len(ids)))
      assert len(ids) == max_len or ids[-1] == EOS
      assert any(ids == sent[i:i + len(ids)] for sent in train_ids
                 for i in range(0, len(sent), max_len))
    assert np.all(t[s == 0] == 0)


def test_reads_lm1b_in_the_tfds_format_without_tensorflow(tmp_path):
  _write_lm1b(tmp_path / "tfds", TRAIN, EVAL)
  cfg = _cfg(tmp_path, dataset="lm1b", data_dir=str(tmp_path / "tfds"))
  validate(cfg)
  corpus = data_lib.read(cfg)
  assert sorted(line for c in corpus.train() for line in c) == sorted(TRAIN)
  assert sorted(line for c in corpus.eval() for line in c) == sorted(EVAL)
  data, tok = data_lib.make(cfg)
  assert tok.vocab_size == 128 and os.path.exists(cfg.tokenizer)
  assert data.name == "lm1b"
  _check(data, tok, TRAIN, EVAL, 64)


def test_reads_text_files_and_reuses_the_saved_tokenizer(tmp_path):
  _write_text(tmp_path / "txt", TRAIN[:200] + ["", "   "] + TRAIN[200:], EVAL)
  cfg = _cfg(tmp_path, dataset="text", data_dir=str(tmp_path / "txt"))
  data, tok = data_lib.make(cfg)
  _check(data, tok, TRAIN, EVAL, 64)
  mtime = os.path.getmtime(cfg.tokenizer)
  again, tok2 = data_lib.make(cfg)                  # loaded, not trained again
  assert os.path.getmtime(cfg.tokenizer) == mtime
  assert tok2.encode(EVAL[:3]) == tok.encode(EVAL[:3])
  assert again.num_train == data.num_train


@pytest.mark.parametrize("what,match", [
    ("no_dir", "does not exist"), ("no_eval", "eval.txt is missing"),
    ("empty", "train.txt has no text"), ("no_lm1b", "no lm1b in --data_dir"),
    ("unset", "--dataset=lm1b reads --data_dir")])
def test_bad_data_dirs_say_what_is_wrong(tmp_path, what, match):
  folder = tmp_path / "d"
  _write_text(folder, [" "] if what == "empty" else TRAIN, EVAL)
  if what == "no_eval":
    os.remove(folder / "eval.txt")
  data_dir = {"no_dir": str(tmp_path / "nowhere"), "unset": ""}.get(what, str(folder))
  dataset = "lm1b" if what in ("no_lm1b", "unset") else "text"
  cfg = _cfg(tmp_path, dataset=dataset, data_dir=data_dir)
  with pytest.raises(UserError, match=match):
    validate(cfg)
    data_lib.make(cfg)


def test_long_sentences_are_split_and_packing_keeps_every_piece_once():
  rng = np.random.default_rng(0)
  seqs = [list(rng.integers(3, 50, rng.integers(1, 30))) + [EOS] for _ in range(200)]
  ps = data_lib.pieces(seqs, 16)
  assert ps.split == sum(len(s) > 16 for s in seqs) > 0
  assert np.all(ps.length <= 16)
  # The pieces of each sentence, in order, are the sentence.
  joined = np.concatenate([ps[i] for i in range(len(ps))])
  assert list(joined) == [t for s in seqs for t in s]
  rows = data_lib.pack(ps.length, 16, rng.permutation(len(ps)))
  assert sorted(int(i) for r in rows for i in r) == list(range(len(ps)))
  assert len(rows) < ps.length.sum() / 16 * 1.3                     # really packed
  out = data_lib.assemble(rows, ps, 16)
  for r, row in enumerate(rows):
    seg, pos, ids = out["segment"][r], out["position"][r], out["tokens"][r]
    for k, i in enumerate(row, 1):
      assert list(ids[seg == k]) == list(ps[i])
      assert list(pos[seg == k]) == list(range(len(ps[i])))
    assert np.all(ids[seg == 0] == 0)
  unpacked = data_lib.pack(ps.length, 16, np.arange(len(ps)), packing=False)
  assert [list(r) for r in unpacked] == [[i] for i in range(len(ps))]


def test_processes_share_batches_and_eval_rows_exactly_once(tmp_path):
  cfg = _cfg(tmp_path, dataset="grammar", grammar_train_examples=300, grammar_eval_examples=45)
  whole, tok = data_lib.make(cfg)
  halves = [data_lib.make(cfg, i, 2)[0] for i in range(2)]
  for full, a, b in zip(whole.train(1), halves[0].train(1), halves[1].train(1)):
    for k in full:
      assert np.array_equal(np.concatenate([a[k], b[k]]), full[k])
  assert halves[0].num_train == whole.num_train and halves[0].eval_steps == whole.eval_steps
  rows0, n0 = _eval_rows_local(halves[0], 8)
  rows1, n1 = _eval_rows_local(halves[1], 8)
  every, n = _eval_rows(whole)
  # Strided shares of the same packed rows: together, every row exactly once (as a multiset:
  # rows may repeat, e.g. a lone end-of-sentence piece).
  assert len(rows0) + len(rows1) == len(every) == whole.num_eval
  assert collections.Counter(rows0 + rows1) == collections.Counter(every)
  want = sum(len(s) for s in tok.encode(data_lib.grammar_lines(45, 2, True)))
  assert n0 + n1 == n == want


def _eval_rows_local(data, local):
  rows, tokens = [], 0
  steps = 0
  for b in data.eval():
    steps += 1
    assert b["tokens"].shape[0] == local
    for t, s, m in zip(b["tokens"], b["segment"], b["mask"]):
      if m:
        rows.append(tuple(t) + tuple(s))
        tokens += int((s > 0).sum())
  assert steps == data.eval_steps
  return rows, tokens


def test_grammar_lines_are_english_then_german():
  en_only = data_lib.grammar_lines(3, 1, False)
  pairs = data_lib.grammar_lines(3, 1, True)
  assert [p.split(" = ")[0] for p in pairs] == en_only
  assert all(p.count(" = ") == 1 and p.endswith(".") for p in pairs)
  tok = tok_lib.Tokenizer(tok_lib.train_model(iter(TRAIN), 128))
  assert all(s[-1] == EOS for s in tok.encode(pairs))


def test_described_lm1b_has_the_read_batches_shapes(tmp_path):
  """Compile-only runs describe lm1b (its sentence counts, packed rows estimated) unread."""
  from tests import helpers
  _write_lm1b(tmp_path / "tfds", TRAIN, EVAL)
  cfg = _cfg(tmp_path, dataset="lm1b", data_dir=str(tmp_path / "tfds"))
  described = data_lib.describe(cfg)
  helpers.assert_described_like_read(described, data_lib.make(cfg)[0])
  assert described.num_train == 30301028 // (64 // data_lib.LM1B_TOKENS_PER_SENTENCE)
