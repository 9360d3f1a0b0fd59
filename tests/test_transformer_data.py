"""Translation data: WMT14 in the tfds ArrayRecord format and plain text files, both built here,
read without TensorFlow; the tokenizer, max_sequence_length and packing."""

import dataclasses
import os

import numpy as np
import pytest

from benchmarks.common import grammar
from benchmarks.common.tokenizer import EOS
from benchmarks.transformer import data as data_lib
from benchmarks.transformer.config import PRESETS
from runtime.errors import UserError

EN, DE = grammar.corpus(1200, 5)


def _cfg(tmp_path, **kw):
  base = dict(global_batch_size=32, eval_batch_size=16, vocab_size=128,
              tokenizer=str(tmp_path / "spm.model"), max_sequence_length=24)
  base.update(kw)
  return dataclasses.replace(PRESETS["cpu"], **base)


def _write_text(folder, split, en, de):
  os.makedirs(folder, exist_ok=True)
  for lang, lines in (("en", en), ("de", de)):
    with open(os.path.join(folder, f"{split}.{lang}"), "w", encoding="utf-8") as f:
      f.write("".join(line + "\n" for line in lines))


# tests/test_bad_input.py reads it from here.
_write_wmt14 = data_lib.write_wmt14


def _check_batches(data, refs, eval_de, max_len):
  batch = next(iter(data.train(0)))
  assert set(batch) == set(data_lib.TRAIN_FIELDS)
  assert batch["inputs"].shape == (32, max_len)
  # Every row holds one sentence ending with end-of-sentence, padding after it.
  for row, seg in zip(batch["targets"], batch["targets_segment"]):
    n = int(np.sum(seg > 0))
    assert row[n - 1] == EOS and np.all(row[n:] == 0) and np.all(row[:n] > 0)
  seen = []
  for b in data.eval():
    seen += [int(i) for i, m in zip(b["index"], b["mask"]) if m]
    assert b["inputs"].shape == (16, 48)
  assert sorted(seen) == list(range(len(eval_de)))
  assert refs == eval_de


def test_reads_wmt14_in_the_tfds_format_without_tensorflow(tmp_path):
  _write_wmt14(tmp_path / "tfds", (EN[:1000], DE[:1000]), (EN[1000:], DE[1000:]))
  cfg = _cfg(tmp_path, dataset="wmt14", data_dir=str(tmp_path / "tfds"))
  corpus = data_lib.read(cfg)
  assert sorted(zip(corpus.train_source, corpus.train_target)) == sorted(zip(EN[:1000],
                                                                             DE[:1000]))
  data, refs, tok = data_lib.make(cfg)
  assert data.num_eval == 200 and refs == corpus.eval_target
  _check_batches(data, refs, corpus.eval_target, 24)
  assert tok.vocab_size == 128 and os.path.exists(cfg.tokenizer)


def test_reads_plain_parallel_text_and_reuses_the_saved_tokenizer(tmp_path):
  _write_text(tmp_path / "txt", "train", EN[:1000], DE[:1000])
  _write_text(tmp_path / "txt", "test", EN[1000:], DE[1000:])
  cfg = _cfg(tmp_path, dataset="text", data_dir=str(tmp_path / "txt"))
  data, refs, tok = data_lib.make(cfg)
  _check_batches(data, refs, DE[1000:], 24)
  mtime = os.path.getmtime(cfg.tokenizer)
  _, _, tok2 = data_lib.make(cfg)                    # loaded, not trained again
  assert os.path.getmtime(cfg.tokenizer) == mtime
  assert tok2.encode([EN[0]]) == tok.encode([EN[0]])
  assert tok.decode(np.array(tok.encode([DE[3]])[0] + [0, 0])) == DE[3]
  with pytest.raises(UserError, match="has 128 pieces but --vocab_size=96"):
    data_lib.make(dataclasses.replace(cfg, vocab_size=96))


@pytest.mark.parametrize("what,match", [
    ("missing", "test.de is missing"), ("uneven", "has 1000 lines but train.de has 999"),
    ("no_tfds", "no wmt14_translate/de-en in --data_dir")])
def test_bad_data_dirs_say_what_is_wrong(tmp_path, what, match):
  folder = tmp_path / "d"
  _write_text(folder, "train", EN[:1000], DE[:999] if what == "uneven" else DE[:1000])
  if what != "missing":
    _write_text(folder, "test", EN[1000:], DE[1000:])
  else:
    (folder / "test.en").write_text("x\n")
  cfg = _cfg(tmp_path, dataset="wmt14" if what == "no_tfds" else "text", data_dir=str(folder))
  with pytest.raises(UserError, match=match):
    data_lib.make(cfg)


def test_max_sequence_length_discards_or_truncates():
  src = [[5, 6, EOS], [5, 6, 7, 8, 9, EOS], [5, EOS]]
  tgt = [[7, EOS], [7, EOS], [5, 6, 7, 8, 9, 9, EOS]]
  kept = data_lib.filter_pairs(src, tgt, 4, "discard")
  assert kept == ([[5, 6, EOS]], [[7, EOS]])
  cut = data_lib.filter_pairs(src, tgt, 4, "truncate")
  assert cut[0] == [[5, 6, EOS], [5, 6, 7, EOS], [5, EOS]]
  assert cut[1] == [[7, EOS], [7, EOS], [5, 6, 7, EOS]]


def test_packing_keeps_every_pair_once_within_its_segment():
  rng = np.random.default_rng(0)
  seqs_s = [list(rng.integers(3, 50, rng.integers(1, 9))) + [EOS] for _ in range(200)]
  seqs_t = [list(rng.integers(3, 50, rng.integers(1, 9))) + [EOS] for _ in range(200)]
  src, tgt = data_lib.Ragged.of(seqs_s), data_lib.Ragged.of(seqs_t)
  rows = data_lib.pack(src.lengths(), tgt.lengths(), 16, rng.permutation(200))
  assert sorted(int(i) for r in rows for i in r) == list(range(200))
  assert len(rows) < 200 / 1.8                                  # really packed
  out = data_lib.assemble(rows, src, tgt, 16)
  for r, pairs in enumerate(rows):
    for side, seqs in (("inputs", seqs_s), ("targets", seqs_t)):
      seg, pos, ids = (out[side + k][r] for k in ("_segment", "_position", ""))
      for k, i in enumerate(pairs, 1):
        assert list(ids[seg == k]) == seqs[i]
        assert list(pos[seg == k]) == list(range(len(seqs[i])))
      assert np.all(ids[seg == 0] == 0)


def test_processes_share_each_global_batch(tmp_path):
  cfg = _cfg(tmp_path, dataset="grammar", grammar_train_examples=400, grammar_eval_examples=50,
             packing=True)
  whole, _, _ = data_lib.make(cfg)
  halves = [data_lib.make(cfg, i, 2)[0] for i in range(2)]
  for full, a, b in zip(whole.train(1), halves[0].train(1), halves[1].train(1)):
    for k in full:
      assert np.array_equal(np.concatenate([a[k], b[k]]), full[k])
  assert halves[0].num_train == whole.num_train
  assert sorted(int(i) for h in halves for b in h.eval() for i, m in zip(b["index"], b["mask"])
                if m) == list(range(50))


def test_described_wmt14_has_the_read_batches_shapes(tmp_path):
  """Compile-only runs describe WMT14 (4,508,785 pairs, packed rows estimated) without reading."""
  from tests import helpers
  _write_wmt14(tmp_path / "tfds", (EN[:300], DE[:300]), (EN[1000:1050], DE[1000:1050]))
  cfg = _cfg(tmp_path, dataset="wmt14", data_dir=str(tmp_path / "tfds"))
  described = data_lib.describe(cfg)
  helpers.assert_described_like_read(described, data_lib.make(cfg)[0])
  assert described.num_eval == 3003 and described.num_train == 4508785     # packing off
  packed = data_lib.describe(dataclasses.replace(cfg, packing=True, max_sequence_length=256,
                                                global_batch_size=2048))
  assert packed.steps_per_epoch == 271        # Google's MLPerf v0.6 epoch of 2,048 x 256 tokens
