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
from mesh.errors import UserError


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
