"""Language-model data: One Billion Word (tfds `lm1b` as ArrayRecord), plain text files, or the
offline grammar corpus; sentencepiece tokens, one end-of-sentence per sentence, rows of
`max_sequence_length` tokens.

A sentence longer than a row is split into pieces of at most `max_sequence_length` tokens, each
its own segment (no token is dropped, so the eval perplexity covers every token). With
`packing`, a row takes pieces greedily while they fit (tensor2tensor's `*_packed` problems, as
the paper's LM trained on `languagemodel_lm1b32k_packed`); without it, one piece per row.

Rows carry `tokens` (the ids to predict), `segment` (0 padding, 1.. the piece within the row)
and `position` (within its piece). Training rows are packed once from a seeded shuffle and
drawn in a new seeded order each epoch; every process computes the same rows and keeps its
share of each global batch. Eval rows are packed in file order; each process takes its own
strided share (`process_indices`), padded with all-padding rows (`mask` 0) so that every eval
token counts exactly once whatever the device and process count.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Iterator

import numpy as np

from benchmarks.common import grammar
from benchmarks.common import tokenizer as tok_lib
from benchmarks.data import (
  Data,
  array_batches,
  described,
  num_steps,
  open_tfds,
  padded,
  process_indices,
  subset_note,
  text_lines,
  tfds_temp_folders_removed,
)
from runtime.errors import UserError

FIELDS = ("tokens", "segment", "position")
NAMES = {**{k: ("batch", "length") for k in FIELDS}, "mask": ("batch",)}
LM1B = "lm1b"
# tfds lm1b: 30,301,028 training and 306,688 test sentences. Assumption for described (unread)
# lm1b only: 32 subword tokens per sentence with a 32k vocabulary (about 27 words each).
LM1B_TRAIN, LM1B_EVAL, LM1B_TOKENS_PER_SENTENCE = 30301028, 306688, 32
_READ_CHUNK = 65536


@dataclasses.dataclass(frozen=True)
class Corpus:
  """The text of a dataset: `train()` and `eval()` yield lists of lines (chunks, so a large
  corpus is tokenized as it is read)."""
  name: str
  train: Callable[[], Iterator[list[str]]]
  eval: Callable[[], Iterator[list[str]]]
  subset: str = ""           # a part of the published dataset (`benchmarks.data.subset_note`)


# --- reading ------------------------------------------------------------------------------------

def grammar_lines(n: int, seed: int, translations: bool) -> list[str]:
  """n grammar sentences: English, or English followed by ' = ' and its German translation."""
  en, de = grammar.corpus(n, seed)
  return [f"{e} = {d}" for e, d in zip(en, de)] if translations else en


def _read_lm1b(cfg) -> Corpus:
  prepare = ("`./run.sh prepare lm1b --from=<folder of 1-billion-word-language-modeling-"
             "benchmark-r13output.tar.gz> --data_dir=...`, or bring plain text files with "
             "--dataset=text")
  sources = {split: open_tfds(cfg.data_dir, LM1B, split, LM1B, prepare)
             for split in ("train", "test")}

  def chunks(split):
    ds = sources[split]
    for lo in range(0, len(ds), _READ_CHUNK):
      yield [r["text"].decode("utf-8") for r in
             ds.__getitems__(range(lo, min(lo + _READ_CHUNK, len(ds))))]
  subset = subset_note(LM1B, {"train": (len(sources["train"]), LM1B_TRAIN),
                              "test": (len(sources["test"]), LM1B_EVAL)})
  return Corpus("lm1b", lambda: chunks("train"), lambda: chunks("test"), subset)


def _read_text(cfg) -> Corpus:
  """`<data_dir>/train.txt` and `<data_dir>/eval.txt`, one sentence or document per line (blank
  lines are skipped)."""
  if not os.path.isdir(cfg.data_dir):
    raise UserError(f"--data_dir={cfg.data_dir} does not exist")
  lines = {}
  for split in ("train", "eval"):
    path = os.path.join(cfg.data_dir, f"{split}.txt")
    if not os.path.exists(path):
      raise UserError(f"--dataset=text: {path} is missing; --data_dir needs train.txt and "
                      f"eval.txt with one sentence (or document) per line")
    lines[split] = [s for s in (line.strip() for line in text_lines(path, "--dataset=text"))
                    if s]
    if not lines[split]:
      raise UserError(f"--dataset=text: {path} has no text; it needs one sentence per line")
  return Corpus(f"text ({cfg.data_dir})", lambda: iter([lines["train"]]),
                lambda: iter([lines["eval"]]))


def read(cfg) -> Corpus:
  if cfg.dataset == "grammar":
    train = grammar_lines(cfg.grammar_train_examples, 1, cfg.grammar_translations)
    evals = grammar_lines(cfg.grammar_eval_examples, 2, cfg.grammar_translations)
    what = "en = de" if cfg.grammar_translations else "en"
    return Corpus(f"grammar {what}", lambda: iter([train]), lambda: iter([evals]))
  if cfg.dataset == "lm1b":
    return _read_lm1b(cfg)
  if cfg.dataset == "text":
    return _read_text(cfg)
  raise UserError(f"--dataset={cfg.dataset}: choose grammar, lm1b or text")


# --- tokenizer ----------------------------------------------------------------------------------

def tokenizer_path(cfg) -> str:
  """--tokenizer, or a cache file keyed by the dataset and vocabulary size."""
  if cfg.tokenizer:
    return cfg.tokenizer
  key = f"lm|{cfg.dataset}|{os.path.abspath(cfg.data_dir) if cfg.data_dir else ''}|" \
        f"{cfg.grammar_train_examples}|{cfg.grammar_translations}"
  return tok_lib.cache_path(f"lm-{cfg.dataset}", key, cfg.vocab_size)


def tokenizer(cfg, corpus: Corpus, process_index: int, say=lambda s: None) -> tok_lib.Tokenizer:
  """Process 0 trains a missing tokenizer on the training text; the others wait for its file."""
  texts = lambda: (line for chunk in corpus.train() for line in chunk)
  return tok_lib.shared(tokenizer_path(cfg), texts, cfg.vocab_size, process_index, say)


# --- token arrays -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Pieces:
  """Token sequences of at most max_len tokens in one flat array: piece i is
  flat[start[i]:start[i] + length[i]]."""
  flat: np.ndarray
  start: np.ndarray
  length: np.ndarray
  sentences: int          # sentences they came from
  split: int              # sentences longer than max_len (split into several pieces)

  def __len__(self) -> int:
    return len(self.start)

  def __getitem__(self, i: int) -> np.ndarray:
    return self.flat[self.start[i]:self.start[i] + self.length[i]]


def pieces(seqs: list[list[int]], max_len: int) -> Pieces:
  """Every sentence cut into consecutive pieces of at most max_len tokens."""
  lengths = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
  offsets = np.concatenate([[0], np.cumsum(lengths)])
  flat = np.fromiter((t for s in seqs for t in s), np.int32, int(offsets[-1]))
  count = -(-lengths // max_len)
  first = np.repeat(offsets[:-1], count)
  k = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)   # piece index
  start = first + k * max_len
  length = np.minimum(np.repeat(lengths, count) - k * max_len, max_len)
  return Pieces(flat, start, length, len(seqs), int(np.sum(count > 1)))


def concat(parts: list[Pieces]) -> Pieces:
  shift = np.cumsum([0] + [len(p.flat) for p in parts[:-1]])
  return Pieces(np.concatenate([p.flat for p in parts]),
                np.concatenate([p.start + s for p, s in zip(parts, shift)]),
                np.concatenate([p.length for p in parts]),
                sum(p.sentences for p in parts), sum(p.split for p in parts))


def encode(tok: tok_lib.Tokenizer, chunks: Iterator[list[str]], max_len: int) -> Pieces:
  parts = [pieces(tok.encode(chunk), max_len) for chunk in chunks]
  return concat(parts) if parts else pieces([], max_len)


def pack(lengths: np.ndarray, max_len: int, order: np.ndarray, packing: bool = True
         ) -> list[np.ndarray]:
  """Rows of piece indices: greedy in `order`, a row takes pieces while they fit in max_len (one
  piece per row without packing)."""
  if not packing:
    return [np.array([i]) for i in order]
  rows, cur, used = [], [], 0
  for i in order.tolist():
    n = int(lengths[i])
    if cur and used + n > max_len:
      rows.append(np.array(cur))
      cur, used = [], 0
    cur.append(i)
    used += n
  if cur:
    rows.append(np.array(cur))
  return rows


def assemble(rows: list[np.ndarray], ps: Pieces, max_len: int) -> dict[str, np.ndarray]:
  """Rows of pieces -> padded token, segment and position arrays (batch, max_len)."""
  out = {k: np.zeros((len(rows), max_len), np.int32) for k in FIELDS}
  for r, row in enumerate(rows):
    at = 0
    for seg, i in enumerate(row, 1):
      n = int(ps.length[i])
      out["tokens"][r, at:at + n] = ps[i]
      out["segment"][r, at:at + n] = seg
      out["position"][r, at:at + n] = np.arange(n)
      at += n
  return out


def describe(cfg, process_count: int = 1) -> Data | None:
  """lm1b's sizes and a batch's shapes, nothing read (compile-only runs); None for the other
  datasets, which are small and are read. Rows: packed rows of max_sequence_length tokens."""
  if cfg.dataset != "lm1b":
    return None
  per_row = max(1, cfg.max_sequence_length // LM1B_TOKENS_PER_SENTENCE) if cfg.packing else 1
  kinds = {"tokens": f"ids:{cfg.vocab_size}", "segment": "one", "position": "position"}
  fields = {k: ((cfg.max_sequence_length,), np.int32, kinds[k]) for k in FIELDS}
  return described("lm1b (described)", LM1B_TRAIN // per_row, LM1B_EVAL // per_row, cfg,
                   process_count, fields, fields, NAMES)


def make(cfg, process_index: int = 0, process_count: int = 1, say=lambda s: None
         ) -> tuple[Data, tok_lib.Tokenizer]:
  """(data, tokenizer)."""
  corpus = read(cfg)
  tok = tokenizer(cfg, corpus, process_index, say)
  t0 = time.time()
  L, G = cfg.max_sequence_length, cfg.global_batch_size
  train_ps = encode(tok, corpus.train(), L)
  eval_ps = encode(tok, corpus.eval(), L)
  if not len(train_ps) or not len(eval_ps):
    raise UserError(f"{corpus.name}: the {'training' if not len(train_ps) else 'eval'} text has "
                    f"no sentences")
  order = np.random.default_rng([cfg.seed, 7]).permutation(len(train_ps))
  rows = pack(train_ps.length, L, order, cfg.packing)
  steps = len(rows) // G
  if steps == 0:
    raise UserError(f"--global_batch_size={G} is larger than the {len(rows)} training rows of "
                    f"{corpus.name}")
  local = G // process_count
  eval_rows = pack(eval_ps.length, L, np.arange(len(eval_ps)), cfg.packing)
  tokens = int(train_ps.length.sum())
  say(f"{corpus.name}: {train_ps.sentences} training sentences, {tokens} tokens "
      f"({tokens / train_ps.sentences:.1f} per sentence), {train_ps.split} longer than {L} "
      f"tokens split into pieces; {len(rows)} rows of {L}{' packed' if cfg.packing else ''} "
      f"({tokens / (len(rows) * L):.0%} full); {eval_ps.sentences} eval sentences, "
      f"{int(eval_ps.length.sum())} tokens, {len(eval_rows)} rows; tokenized in "
      f"{time.time() - t0:.1f}s")

  def train(epoch: int):
    # Every process draws the same global order and keeps its share of each batch.
    perm = np.random.default_rng([cfg.seed, epoch]).permutation(len(rows))[:steps * G]
    for ids in perm.reshape(steps, process_count, local)[:, process_index]:
      yield assemble([rows[i] for i in ids], train_ps, L)

  mine = process_indices(len(eval_rows), process_index, process_count)
  eval_arrays = assemble([eval_rows[i] for i in mine], eval_ps, L)
  local_eval = (cfg.eval_batch_size or G) // process_count
  eval_steps = num_steps(len(eval_rows), local_eval * process_count)

  def evaluate():
    return padded(array_batches(eval_arrays, local_eval), local_eval, eval_steps, eval_arrays)

  data = Data(corpus.name, len(rows), len(eval_rows), steps, eval_steps, train, evaluate, NAMES,
              subset=corpus.subset)
  return data, tok


# --- a small lm1b in the tensorflow-datasets format (tests, `./run.sh perf`) ------------------

def write_lm1b(data_dir, train: list[str], test: list[str]) -> None:
  """lm1b prepared under `data_dir` by tensorflow-datasets' own builder (same name, version and
  features) from these lines instead of the download."""
  import tensorflow_datasets as tfds

  class Lm1b(tfds.builder_cls("lm1b"), skip_registration=True):
    name = "lm1b"

    def _split_generators(self, dl_manager):
      return {"train": self._lines(train), "test": self._lines(test)}

    def _lines(self, lines):
      for i, line in enumerate(lines):
        yield i, {"text": line}

  with tfds_temp_folders_removed():
    builder = Lm1b(data_dir=str(data_dir), file_format="array_record")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(data_dir)))
