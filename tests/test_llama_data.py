"""llama31_8b's C4 files: Megatron's MMIDIDX indexed datasets (`benchmarks/llama/indexed.py`).

- The writer's bytes equal a file spelled out byte by byte from Megatron-LM's layout (magic,
  version, dtype code, counts, lengths, byte offsets, document index), and the reader reads
  documents back exactly, int32 (Llama 3.1's ids) and uint16.
- A damaged pair is refused in one line naming the file: another magic, a .bin cut short, an
  offset that does not follow the lengths, a missing file.
- Rows are the documents end to end cut into length + 1 tokens, neighbours sharing one token.
"""

import os
import struct

import numpy as np
import pytest

from benchmarks.llama import indexed
from runtime.errors import UserError


def test_the_written_index_is_megatrons_layout_byte_for_byte(tmp_path):
  prefix = str(tmp_path / "c4")
  indexed.write(prefix, [np.array([1, 2, 3]), np.array([128_000, 5])])
  want = (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([4]) + struct.pack("<QQ", 2, 3)
          + struct.pack("<ii", 3, 2) + struct.pack("<qq", 0, 12) + struct.pack("<qqq", 0, 1, 2))
  assert open(prefix + ".idx", "rb").read() == want
  assert open(prefix + ".bin", "rb").read() == struct.pack("<iiiii", 1, 2, 3, 128_000, 5)


@pytest.mark.parametrize("dtype", [np.int32, np.uint16])
def test_documents_read_back_exactly(tmp_path, dtype):
  rng = np.random.default_rng(0)
  docs = [rng.integers(0, 60_000, size=n) for n in (5, 0, 17, 1, 300)]
  prefix = str(tmp_path / "c4")
  indexed.write(prefix, docs, dtype)
  ds = indexed.read(prefix)
  assert ds.num_documents == 5 and ds.num_tokens == 323 and ds.tokens.dtype == dtype
  for i, d in enumerate(docs):
    np.testing.assert_array_equal(ds.document(i), d)


def _damage(prefix, suffix, at, data):
  with open(prefix + suffix, "r+b") as f:
    f.seek(at)
    f.write(data)


@pytest.mark.parametrize("damage,needle", [
    (lambda p: _damage(p, ".idx", 0, b"TNTIDX\x00\x00\x00"), "c4.idx: its first bytes are"),
    (lambda p: os.truncate(p + ".bin", 20), "c4.bin: 20 bytes, but c4.idx describes 40"),
    (lambda p: _damage(p, ".idx", 34 + 4 * 3 + 8, struct.pack("<q", 8)),
     "c4.idx: sequence 1 starts at byte 8 of the .bin, not 12"),
    (lambda p: os.truncate(p + ".idx", 40), "c4.idx: 40 bytes, but its header announces 3"),
    (lambda p: os.remove(p + ".bin"), "c4.bin is missing"),
])
def test_a_damaged_dataset_is_one_line(tmp_path, damage, needle):
  prefix = str(tmp_path / "c4")
  indexed.write(prefix, [np.arange(3), np.arange(4), np.arange(3)])
  damage(prefix)
  with pytest.raises(UserError) as e:
    indexed.read(prefix)
  assert needle in str(e.value) and "\n" not in str(e.value)


def test_rows_are_the_documents_end_to_end_sharing_a_token(tmp_path):
  rng = np.random.default_rng(1)
  docs = [rng.integers(1, 1000, size=n) for n in rng.integers(1, 40, size=30)]
  prefix = str(tmp_path / "c4")
  indexed.write(prefix, docs)
  order = rng.permutation(len(docs))
  w = indexed.Windows(indexed.read(prefix), order, 16)
  stream = np.concatenate([docs[i] for i in order])
  assert len(w) == (len(stream) - 1) // 16
  rows = w.rows(range(len(w)))
  for k in range(len(w)):
    np.testing.assert_array_equal(rows[k], stream[16 * k:16 * k + 17])
  assert (rows[1:, 0] == rows[:-1, -1]).all()


def _cfg(**kw):
  import dataclasses

  from benchmarks.llama.config import PRESETS
  return dataclasses.replace(PRESETS["tiny"], **kw)


def test_batches_split_over_processes_and_evaluation_rows_are_fixed(tmp_path, monkeypatch):
  """The tiny preset's grammar corpus, written in C4's format into the cache and read back:
  two processes' shares of each global batch are one process's batch; an epoch never repeats
  a row and the next epoch draws another order; the evaluation is the first eval_samples rows
  of the validation documents in order, split and padded over the processes."""
  from benchmarks.llama import data as data_lib
  monkeypatch.setenv("MESHPERF_CACHE", str(tmp_path / "cache"))
  cfg = _cfg()
  one = data_lib.make(cfg)
  two = [data_lib.make(cfg, i, 2) for i in range(2)]
  assert one.steps_per_epoch == two[0].steps_per_epoch >= 2 and one.num_eval == 16
  for epoch in (0, 1):
    got = list(one.train(epoch))
    halves = [list(d.train(epoch)) for d in two]
    for b, h0, h1 in zip(got, *halves):
      np.testing.assert_array_equal(b["inputs"], np.concatenate([h0["inputs"], h1["inputs"]]))
      np.testing.assert_array_equal(b["inputs"][:, 1:], b["targets"][:, :-1])
    rows = np.concatenate([b["inputs"] for b in got])
    assert len({r.tobytes() for r in rows}) == len(rows)
    if epoch == 0:
      first = rows
  assert not np.array_equal(first, rows)
  folder = tmp_path / "cache" / "llama-grammar-400-64"
  valid = indexed.Windows(indexed.read(str(folder / indexed.VALIDATION)), np.arange(64), 64)
  want = valid.rows(range(16))
  (e1,) = list(one.eval())
  np.testing.assert_array_equal(e1["inputs"], want[:, :-1])
  assert e1["mask"].sum() == 16
  shares = [list(d.eval()) for d in two]
  assert [len(s) for s in shares] == [1, 1]
  np.testing.assert_array_equal(shares[1][0]["targets"][:8], want[1::2, 1:])


def test_c4_folder_errors_are_one_line(tmp_path):
  from benchmarks.llama import data as data_lib
  with pytest.raises(UserError, match="c4-train.en_6_text_document.idx is missing"):
    data_lib.make(_cfg(dataset="c4", data_dir=str(tmp_path)))
  rng = np.random.default_rng(0)
  for name in (indexed.TRAIN, indexed.VALIDATION):
    indexed.write(str(tmp_path / name), [rng.integers(1, 1100, size=300) for _ in range(10)])
  with pytest.raises(UserError, match="outside the model's --vocab_size=1,024"):
    data_lib.make(_cfg(dataset="c4", data_dir=str(tmp_path)))
  with pytest.raises(UserError, match="fewer than --eval_samples=1024"):
    data_lib.make(_cfg(dataset="c4", data_dir=str(tmp_path), vocab_size=2000, eval_samples=1024))
