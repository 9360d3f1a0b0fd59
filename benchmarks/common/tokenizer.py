"""A joint source/target sentencepiece subword vocabulary (shared embeddings need one).

Trained from the training text on first use and saved, or loaded from a path. Ids: 0 padding,
1 end of sentence, 2 unknown; no begin-of-sentence id (the decoder starts from padding, 0).
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import time
from typing import Callable, Iterable, Sequence

import numpy as np

from benchmarks.config import check_writable
from runtime import host
from runtime.errors import UserError

PAD, EOS, UNK = 0, 1, 2


class Tokenizer:
  """A loaded sentencepiece model; `encode` appends EOS, `decode` stops at EOS."""

  def __init__(self, model_proto: bytes, path: str = ""):
    import sentencepiece as spm
    self.path = path
    try:
      self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
    except (RuntimeError, OSError, ValueError) as e:
      raise UserError(f"tokenizer {path} is not a sentencepiece model ({str(e).strip()[:120]}); "
                      f"pass a .model file that sentencepiece wrote, or a path that does not "
                      f"exist yet to train one there") from None
    if (self.sp.pad_id(), self.sp.eos_id(), self.sp.unk_id()) != (PAD, EOS, UNK):
      raise UserError(f"tokenizer {path}: expected pad/eos/unk ids 0/1/2, got "
                      f"{self.sp.pad_id()}/{self.sp.eos_id()}/{self.sp.unk_id()}; delete it to "
                      f"train a new one")

  @property
  def vocab_size(self) -> int:
    return self.sp.get_piece_size()

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    return [ids + [EOS] for ids in self.sp.encode(list(texts), num_threads=os.cpu_count() or 1)]

  def decode(self, ids: np.ndarray) -> str:
    ids = [int(i) for i in ids]
    if EOS in ids:
      ids = ids[:ids.index(EOS)]
    return self.sp.decode([i for i in ids if i not in (PAD, EOS) and i < self.vocab_size])


def train_model(texts: Iterable[str], vocab_size: int, max_sentences: int = 2_000_000) -> bytes:
  """A unigram sentencepiece model proto trained on `texts` (sampled to `max_sentences`)."""
  import sentencepiece as spm
  out = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=out, vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0, pad_id=PAD, eos_id=EOS, unk_id=UNK,
        bos_id=-1, input_sentence_size=max_sentences, shuffle_input_sentence=True,
        num_threads=os.cpu_count() or 1, minloglevel=2)
  except RuntimeError as e:
    raise UserError(f"sentencepiece could not train a {vocab_size}-piece vocabulary on this "
                    f"text ({str(e).splitlines()[-1]}); choose a smaller --vocab_size") from None
  return out.getvalue()


def _load(path: str, vocab_size: int) -> Tokenizer:
  if os.path.isdir(path):
    raise UserError(f"tokenizer {path} is a folder; name a .model file (loaded if it exists, "
                    f"trained there if not)")
  try:
    with open(path, "rb") as f:
      tok = Tokenizer(f.read(), path)
  except OSError as e:
    raise UserError(f"cannot read tokenizer {path} ({e.strerror})") from None
  if tok.vocab_size != vocab_size:
    raise UserError(f"tokenizer {path} has {tok.vocab_size} pieces but --vocab_size="
                    f"{vocab_size}; pass --vocab_size={tok.vocab_size} or another "
                    f"--tokenizer path")
  return tok


def check(path: str, vocab_size: int) -> None:
  """Before anything is read or trained: a model at `path` loads with `vocab_size` pieces, or
  one can be written there (see `benchmarks.config.check_writable`)."""
  if os.path.exists(path):
    _load(path, vocab_size)
  else:
    check_writable("--tokenizer", path, kind="file")


def load_or_train(path: str, texts: Callable[[], Iterable[str]], vocab_size: int,
                  say: Callable[[str], None] = lambda s: None) -> Tokenizer:
  """Loads the model at `path`, or trains one from `texts()` and saves it there first."""
  if os.path.exists(path):
    return _load(path, vocab_size)
  say(f"training a {vocab_size}-piece sentencepiece vocabulary -> {path}")
  proto = train_model(texts(), vocab_size)
  directory = os.path.dirname(os.path.abspath(path))
  tmp = None
  try:
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")   # atomic: no half-written model
    with os.fdopen(fd, "wb") as f:
      f.write(proto)
    os.replace(tmp, path)
  except OSError as e:
    if tmp and os.path.exists(tmp):
      os.remove(tmp)
    raise UserError(f"cannot save the tokenizer to {path} ({e.strerror}); pass a --tokenizer "
                    f"path you can write") from None
  return Tokenizer(proto, path)


def cache_path(prefix: str, key: str, vocab_size: int) -> str:
  """A cached tokenizer's file: `$MESHPERF_CACHE` (or `~/.cache/meshperf`)/tokenizers/
  <prefix>-<hash of key>-<vocab_size>.model."""
  digest = hashlib.sha1(key.encode()).hexdigest()[:10]
  return os.path.join(host.cache_root(), "tokenizers", f"{prefix}-{digest}-{vocab_size}.model")


def shared(path: str, texts: Callable[[], Iterable[str]], vocab_size: int, process_index: int,
           say: Callable[[str], None] = lambda s: None, wait_s: float = 1800) -> Tokenizer:
  """One vocabulary for every process: process 0 loads or trains the model at `path`, the
  others wait for its file (hosts need a shared path) and load it."""
  if process_index != 0:
    deadline = time.time() + wait_s
    while not os.path.exists(path):
      if time.time() > deadline:
        raise UserError(f"process {process_index}: no tokenizer at {path} after "
                        f"{wait_s / 60:.0f} minutes; pass a shared --tokenizer path")
      time.sleep(1)
  return load_or_train(path, texts, vocab_size, say)
