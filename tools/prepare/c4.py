"""llama31_8b's C4 as MLCommons distributes it, checked and placed where `--dataset=c4` reads.

MLCommons' download (mlcommons/training `small_llm_pretraining/nemo/README.md`, the
`llama-3-1-8b-preprocessed-c4-dataset`) is already the format the benchmark reads: two Megatron
indexed datasets (`benchmarks/llama/indexed.py`). Nothing is converted; each of the four files
is checked and then linked (a hard link on the same file system, else a symbolic link) into
`--data_dir` under its own name:

- both `.idx` files parse (Megatron's MMIDIDX version 1: header, offsets, document index) and
  each `.bin` is exactly the size its index describes (a download cut short is named);
- the validation set has its 91,205 documents (the file's own name says so; `--subset` accepts
  fewer) and the training file its 83,976,774,280 bytes (the size NVIDIA's v5.1 submission lists,
  `expected-mounts-8b.csv` in mlcommons/training_results_v5.1);
- every token id is within Llama 3.1's 128,256 (`indexed.check_ids`: one pass over each `.bin`,
  remembered in the cache so the first run does not scan again).
"""

from __future__ import annotations

import os
from typing import Callable

from benchmarks.llama import indexed
from benchmarks.llama.config import LLAMA31_VOCAB
from benchmarks.llama.data import C4_TRAIN_TOKENS
from benchmarks.llama.data import C4_VALIDATION_DOCUMENTS as VALIDATION_DOCUMENTS
from runtime.errors import UserError

FILES = tuple(f"{p}.{ext}" for p in (indexed.TRAIN, indexed.VALIDATION) for ext in ("idx", "bin"))
# Bytes of the download (`cli._check_disk` needs none: links take no space).
ARCHIVE_BYTES: dict[str, int] = {}


def check(src: str, subset: bool, say: Callable[[str], None]) -> dict[str, dict[str, int]]:
  """The two datasets in `src`, checked (module docstring): per split its documents and tokens.
  UserError naming the file and what is wrong otherwise."""
  missing = [n for n in FILES if not os.path.isfile(os.path.join(src, n))]
  if missing:
    raise UserError(f"--from={src} lacks {', '.join(missing)}: it must hold MLCommons' "
                    f"preprocessed C4 for llama31_8b as downloaded ({', '.join(FILES)})")
  found = {}
  for split, prefix in (("validation", indexed.VALIDATION), ("train", indexed.TRAIN)):
    ds = indexed.read(os.path.join(src, prefix))
    found[split] = {"documents": ds.num_documents, "tokens": ds.num_tokens}
    say(f"prepare: {prefix}: {ds.num_documents:,} documents, {ds.num_tokens:,} tokens")
    if split == "validation" and ds.num_documents != VALIDATION_DOCUMENTS and not (
        subset and ds.num_documents < VALIDATION_DOCUMENTS):
      raise UserError(f"{ds.prefix}.idx holds {ds.num_documents:,} documents, not the "
                      f"{VALIDATION_DOCUMENTS:,} its name promises; download it again (or pass "
                      f"--subset for a part, which runs then name)")
    if split == "train" and ds.num_tokens != C4_TRAIN_TOKENS and not (
        subset and ds.num_tokens < C4_TRAIN_TOKENS):
      raise UserError(f"{ds.prefix}.bin holds {ds.num_tokens:,} tokens, not the published "
                      f"{C4_TRAIN_TOKENS:,} ({C4_TRAIN_TOKENS * 4:,} bytes); download it again "
                      f"(or pass --subset for a part, which runs then name)")
    indexed.check_ids(ds, LLAMA31_VOCAB, say)
  return found


def place(src: str, data_dir: str, say: Callable[[str], None]) -> list[str]:
  """Each file linked into `data_dir` (hard, else symbolic); nothing done where `data_dir` is
  `src` or already holds the same file. Returns how each was placed."""
  os.makedirs(data_dir, exist_ok=True)
  how = []
  for name in FILES:
    have, want = os.path.join(src, name), os.path.join(data_dir, name)
    if os.path.exists(want) and os.path.samefile(have, want):
      how.append(f"{name}: already there")
      continue
    if os.path.lexists(want):
      raise UserError(f"{want} exists and is another file; remove it, or choose another "
                      f"--data_dir")
    try:
      os.link(have, want)
      how.append(f"{name}: hard link")
    except OSError:                   # another file system, or links not allowed
      os.symlink(os.path.abspath(have), want)
      how.append(f"{name}: symbolic link to {os.path.abspath(have)}")
  for line in how:
    say(f"prepare: {line}")
  return how
