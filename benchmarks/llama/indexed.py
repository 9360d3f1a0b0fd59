"""MLPerf llama31_8b's C4 as MLCommons distributes it: Megatron "MMap indexed dataset" pairs.

The preprocessed dataset (mlcommons/training, `small_llm_pretraining/nemo/README.md`: made by
NeMo's `preprocess_data_for_megatron.py --dataset-impl mmap` with Llama 3.1's tokenizer) is two
pairs of files in one folder:

  c4-train.en_6_text_document.{bin,idx}                  C4 train shards 768-895, 84 GB
  c4-validation-91205-samples.en_text_document.{bin,idx} C4's first 91,205 validation documents

`.bin` holds every document's token ids back to back, no header and no separator tokens;
`.idx` describes them (Megatron-LM's `megatron/core/datasets/indexed_dataset.py`, `_IndexWriter`
and `_IndexReader`, format version 1), all little-endian:

  offset 0    9 bytes   magic b"MMIDIDX\\x00\\x00"
  offset 9    uint64    version, 1
  offset 17   uint8     dtype code of the tokens (`DTYPES`; 4, int32, for Llama 3.1's 128,256 ids)
  offset 18   uint64    N, the number of sequences (here one per document)
  offset 26   uint64    D, the length of the document index (documents + 1)
  offset 34   int32[N]  tokens of each sequence
              int64[N]  byte offset of each sequence in .bin
              int64[D]  document index: 0, then the number of sequences at each document's end

Read without Megatron or NeMo: the index with numpy, `.bin` memory-mapped, so an 84 GB file costs
what is touched. `write` makes the same files (the tests' small datasets).
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import tempfile

import numpy as np

from runtime import host
from runtime.errors import UserError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}
HEADER = struct.Struct("<9sQBQQ")          # 34 bytes
TRAIN = "c4-train.en_6_text_document"
VALIDATION = "c4-validation-91205-samples.en_text_document"


@dataclasses.dataclass(frozen=True)
class Indexed:
  """One indexed dataset: `tokens` the whole .bin (memory-mapped), and per document its first
  token's position there and its length in tokens."""
  prefix: str
  tokens: np.ndarray
  starts: np.ndarray         # int64[documents]: token offsets into `tokens`
  lengths: np.ndarray        # int64[documents]

  @property
  def num_documents(self) -> int:
    return len(self.lengths)

  @property
  def num_tokens(self) -> int:
    return int(self.lengths.sum())

  def document(self, i: int) -> np.ndarray:
    return self.tokens[self.starts[i]:self.starts[i] + self.lengths[i]]


def _bad(path: str, what: str) -> UserError:
  return UserError(f"{path}: {what}; it is not an indexed dataset as MLCommons' preprocessed C4 "
                   f"ships it (Megatron's MMIDIDX version 1): download it again")


def read(prefix: str) -> Indexed:
  """The indexed dataset `<prefix>.idx` + `<prefix>.bin`, checked whole: the header, the sizes of
  both files against it, every sequence's offset and the document index (UserError naming the
  file otherwise)."""
  idx, bin_ = f"{prefix}.idx", f"{prefix}.bin"
  for path in (idx, bin_):
    if not os.path.isfile(path):
      raise UserError(f"{path} is missing: the folder needs {os.path.basename(prefix)}.idx and "
                      f".bin (MLCommons' preprocessed C4 for llama31_8b)")
  size = os.path.getsize(idx)
  with open(idx, "rb") as f:
    head = f.read(HEADER.size)
    if len(head) < HEADER.size:
      raise _bad(idx, f"{size} bytes, shorter than the 34-byte header")
    magic, version, code, n, d = HEADER.unpack(head)
    if magic != MAGIC:
      raise _bad(idx, f"its first bytes are {magic!r}, not {MAGIC!r}")
    if version != VERSION:
      raise _bad(idx, f"version {version}, not {VERSION}")
    if code not in DTYPES:
      raise _bad(idx, f"dtype code {code}, not one of {sorted(DTYPES)}")
    want = HEADER.size + 12 * n + 8 * d
    if size < want:
      raise _bad(idx, f"{size} bytes, but its header announces {n:,} sequences and {d:,} "
                      f"document-index entries ({want:,} bytes)")
    lengths = np.frombuffer(f.read(4 * n), "<i4").astype(np.int64)
    pointers = np.frombuffer(f.read(8 * n), "<i8")
    documents = np.frombuffer(f.read(8 * d), "<i8")
  dtype = np.dtype(DTYPES[code]).newbyteorder("<")
  if not np.issubdtype(dtype, np.integer):
    raise _bad(idx, f"its tokens are {dtype.name} (dtype code {code}), and token ids are "
                    f"integers (MLCommons' C4 holds int32, code 4)")
  if (lengths < 0).any():
    raise _bad(idx, "a sequence of negative length")
  expected = np.concatenate([[0], np.cumsum(lengths[:-1] * dtype.itemsize)]) if n else lengths
  if not np.array_equal(pointers, expected):
    first = int(np.argmax(pointers != expected))
    raise _bad(idx, f"sequence {first} starts at byte {pointers[first]:,} of the .bin, not "
                    f"{expected[first]:,} where the ones before it end")
  if d == 0 or documents[0] != 0 or documents[-1] != n or (np.diff(documents) < 0).any():
    raise _bad(idx, "its document index does not run from 0 to the sequence count")
  total = int(lengths.sum()) * dtype.itemsize
  if os.path.getsize(bin_) != total:
    raise _bad(bin_, f"{os.path.getsize(bin_):,} bytes, but {os.path.basename(idx)} describes "
                     f"{total:,} (a download cut short?)")
  tokens = np.memmap(bin_, dtype=dtype, mode="r") if total else np.zeros(0, dtype)
  # A document is the run of sequences between two entries of the document index (one each
  # here: the preprocessing does not split documents into sentences), contiguous in the .bin.
  at = np.concatenate([[0], np.cumsum(lengths)])      # token offset of each sequence, and the end
  return Indexed(prefix, tokens, at[documents[:-1]], at[documents[1:]] - at[documents[:-1]])


def write(prefix: str, documents: list[np.ndarray], dtype=np.int32) -> None:
  """`documents` (arrays of token ids) as `<prefix>.bin` and `<prefix>.idx`, one sequence per
  document, in the layout `read` reads (and Megatron's builder writes)."""
  code = next(c for c, t in DTYPES.items() if np.dtype(t) == np.dtype(dtype))
  dt = np.dtype(dtype).newbyteorder("<")
  lengths = np.array([len(d) for d in documents], np.int64)
  pointers = np.concatenate([[0], np.cumsum(lengths[:-1] * dt.itemsize)]).astype("<i8") \
      if len(documents) else np.zeros(0, "<i8")
  with open(f"{prefix}.bin", "wb") as f:
    for d in documents:
      f.write(np.asarray(d).astype(dt).tobytes())
  with open(f"{prefix}.idx", "wb") as f:
    f.write(HEADER.pack(MAGIC, VERSION, code, len(documents), len(documents) + 1))
    f.write(lengths.astype("<i4").tobytes())
    f.write(pointers.tobytes())
    f.write(np.arange(len(documents) + 1, dtype="<i8").tobytes())


@dataclasses.dataclass(frozen=True)
class Windows:
  """Rows of `length` + 1 tokens cut from the documents of `ds` put end to end in `order` (the
  reference's samples: Megatron's GPTDataset with `add_extra_token_to_sequence`, consecutive
  rows sharing one boundary token; the inputs are a row's first `length` tokens, the targets its
  last `length`). Attention runs across document boundaries and positions run 0..length-1, as
  the reference trains (`reset_position_ids` and `reset_attention_mask` off). Only whole rows."""
  ds: Indexed
  order: np.ndarray          # documents in the order they are put end to end
  length: int
  ends: np.ndarray = dataclasses.field(init=False, repr=False)   # where each one ends

  def __post_init__(self):
    object.__setattr__(self, "ends", np.cumsum(self.ds.lengths[self.order]))

  def __len__(self) -> int:
    total = int(self.ends[-1]) if len(self.ends) else 0
    return max(0, (total - 1) // self.length)

  def row(self, k: int) -> np.ndarray:
    """Row k: tokens k * length .. (k + 1) * length of the stream, both ends included."""
    start, stop = k * self.length, (k + 1) * self.length + 1
    i = int(np.searchsorted(self.ends, start, side="right"))
    pieces, at = [], start
    while at < stop:
      doc = int(self.order[i])
      begin = at - (int(self.ends[i]) - int(self.ds.lengths[doc]))
      take = min(stop - at, int(self.ds.lengths[doc]) - begin)
      pieces.append(self.ds.document(doc)[begin:begin + take])
      at += take
      i += 1
    return np.concatenate(pieces).astype(np.int32)

  def rows(self, ks) -> np.ndarray:
    return np.stack([self.row(int(k)) for k in ks]) if len(ks) else np.zeros(
        (0, self.length + 1), np.int32)


# Token ids scanned per chunk by `check_ids`: 256 MiB of int32.
_CHUNK = 1 << 26
CHECKED = "token-ranges.json"      # in the cache: each .bin's smallest and largest id, by stamp


def _stamp(path: str) -> str:
  st = os.stat(path)
  return f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}"


def _ranges() -> dict:
  try:
    with open(os.path.join(host.cache_root(), CHECKED)) as f:
      known = json.load(f)
    return known if isinstance(known, dict) else {}
  except (OSError, ValueError):
    return {}


def _remember(stamp: str, lo: int, hi: int) -> None:
  """Adds a file's id range to the cache (written whole, then renamed); a cache that cannot be
  written is left as it is: the next run scans again."""
  known = {**_ranges(), stamp: [lo, hi]}
  folder = host.cache_root()
  try:
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{CHECKED}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
      json.dump(known, f)
    os.replace(tmp, os.path.join(folder, CHECKED))
  except OSError:
    pass


def check_ids(ds: Indexed, vocab_size: int, say=print) -> None:
  """Every token id of the dataset in [0, vocab_size), or a UserError naming the file, the
  first id outside and its document: an id past the embedding table is read as garbage (XLA
  clamps a gather's index) or NaN, and the run would end as diverged far from the cause. The
  whole .bin is scanned once per file (its range kept in the cache under its path, size and
  modification time), with a progress line for large files."""
  path = f"{ds.prefix}.bin"
  stamp = _stamp(path)
  known = _ranges().get(stamp)
  if isinstance(known, list) and len(known) == 2 and 0 <= known[0] and known[1] < vocab_size:
    return
  n = len(ds.tokens)
  if n > 4 * _CHUNK:
    say(f"checking the {n:,} token ids of {path} against --vocab_size={vocab_size:,} (once per "
        f"file)")
  lo, hi = 0, 0
  for at in range(0, n, _CHUNK):
    chunk = np.asarray(ds.tokens[at:at + _CHUNK])
    c_lo, c_hi = int(chunk.min()), int(chunk.max())
    if c_lo < 0 or c_hi >= vocab_size:
      i = at + int(np.argmax((chunk < 0) | (chunk >= vocab_size)))
      document = int(np.searchsorted(ds.starts, i, side="right")) - 1
      raise UserError(f"{path}: token {i:,} (document {document:,}) is id {int(ds.tokens[i])}, "
                      f"outside the model's --vocab_size={vocab_size:,} (ids 0 to "
                      f"{vocab_size - 1:,}; Llama 3.1's vocabulary is 128,256): the file is "
                      f"damaged or of another tokenizer")
    lo, hi = (c_lo, c_hi) if at == 0 else (min(lo, c_lo), max(hi, c_hi))
  if n:
    _remember(stamp, lo, hi)
