"""Translation data: WMT14 En-De (tfds ArrayRecord), plain parallel text files, or the grammar
corpus; sentencepiece tokens, max_sequence_length (discard or truncate) and optional packing.

Training rows carry `inputs`/`targets` token ids with per-token `*_segment` ids (0 padding,
1.. the sentence pair within a packed row) and `*_position` (position within its sentence).
Eval rows carry the source `inputs`, the example `index` (to find its reference text on the
host) and `mask`.
"""

from __future__ import annotations

import dataclasses
import os
import time

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

TRAIN_FIELDS = ("inputs", "inputs_segment", "inputs_position", "targets", "targets_segment",
                "targets_position")
NAMES = {**{k: ("batch", "length") for k in TRAIN_FIELDS}, "index": ("batch",),
         "mask": ("batch",)}
WMT14 = "wmt14_translate/de-en"
# tfds wmt14_translate/de-en: 4,508,785 training pairs; newstest2014, the MLPerf eval set: 3,003.
WMT14_TRAIN_PAIRS, WMT14_EVAL = 4508785, 3003
WMT14_PUBLISHED = {"train": WMT14_TRAIN_PAIRS, "validation": 3000, "test": WMT14_EVAL}
# For described (unread) WMT14 only: packed tokens per pair, packing's waste included. Google's
# MLPerf v0.6 Transformer packed WMT14 en-de (32k vocabulary) into rows of 256 tokens, 271 steps
# of 2,048 rows per epoch (mlcommons/training_results_v0.6, Google/benchmarks/transformer/
# tpu-v3-*/run_and_time.sh): 256 x 271 x 2048 / 4,508,785 = 31.5 tokens per pair. Assumed the
# same for other row lengths; a read dataset counts its real rows.
PACKED_TOKENS_PER_PAIR = 256 * 271 * 2048 / WMT14_TRAIN_PAIRS


@dataclasses.dataclass(frozen=True)
class Corpus:
  name: str
  train_source: list[str]
  train_target: list[str]
  eval_source: list[str]
  eval_target: list[str]
  subset: str = ""           # a part of the published dataset (`benchmarks.data.subset_note`)


# --- reading ------------------------------------------------------------------------------------

def _read_tfds(cfg) -> Corpus:
  # Registers the translation builders (tfds.data_source needs wmt14_translate's).
  import tensorflow_datasets.translate  # noqa: F401
  prepare = ("`./run.sh prepare wmt14 --from=<folder of the WMT14 training archives and "
             "dev.tgz> --data_dir=...`, or bring plain text files with --dataset=text")
  src, tgt = cfg.source_language, cfg.target_language
  if {src, tgt} != {"en", "de"}:
    raise UserError(f"--dataset=wmt14 is {WMT14}: --source_language/--target_language must be "
                    f"en and de (got {src}, {tgt})")
  out, counts = [], {}
  for split in ("train", cfg.eval_split):
    ds = open_tfds(cfg.data_dir, WMT14, split, "wmt14", prepare)
    counts[split] = (len(ds), WMT14_PUBLISHED[split])
    records = [r for lo in range(0, len(ds), 65536)          # batched reads (4.5M records)
               for r in ds.__getitems__(range(lo, min(lo + 65536, len(ds))))]
    out += [[r[src].decode("utf-8") for r in records], [r[tgt].decode("utf-8") for r in records]]
  return Corpus(f"wmt14 {src}-{tgt}", *out, subset=subset_note(WMT14, counts))


def _read_lines(path: str) -> list[str]:
  return text_lines(path, "--dataset=text")


def _read_text(cfg) -> Corpus:
  """`<data_dir>/train.<src>`, `train.<tgt>`, `<eval_split>.<src>`, `<eval_split>.<tgt>`."""
  if not os.path.isdir(cfg.data_dir):
    raise UserError(f"--data_dir={cfg.data_dir} does not exist")
  out = []
  for split in ("train", cfg.eval_split):
    pair = []
    for lang in (cfg.source_language, cfg.target_language):
      path = os.path.join(cfg.data_dir, f"{split}.{lang}")
      if not os.path.exists(path):
        raise UserError(f"--dataset=text: {path} is missing; --data_dir needs train.<src>, "
                        f"train.<tgt>, {cfg.eval_split}.<src> and {cfg.eval_split}.<tgt> files "
                        f"with one sentence per line (--eval_split names the eval files)")
      pair.append(_read_lines(path))
    if len(pair[0]) != len(pair[1]):
      raise UserError(f"--dataset=text: {split}.{cfg.source_language} has {len(pair[0])} lines "
                      f"but {split}.{cfg.target_language} has {len(pair[1])}; parallel files "
                      f"need one sentence per line on both sides")
    if not pair[0]:
      raise UserError(f"--dataset=text: {split}.{cfg.source_language} is empty")
    out += pair
  return Corpus(f"text {cfg.source_language}-{cfg.target_language} ({cfg.data_dir})", *out)


def read(cfg) -> Corpus:
  if cfg.dataset == "grammar":
    if (cfg.source_language, cfg.target_language) != ("en", "de"):
      raise UserError("--dataset=grammar translates en to de")
    return Corpus("grammar en-de", *grammar.corpus(cfg.grammar_train_examples, 1),
                  *grammar.corpus(cfg.grammar_eval_examples, 2))
  return _read_tfds(cfg) if cfg.dataset == "wmt14" else _read_text(cfg)


# --- tokenizer ----------------------------------------------------------------------------------

def tokenizer_path(cfg) -> str:
  """--tokenizer, or a cache file keyed by the dataset and vocabulary size."""
  if cfg.tokenizer:
    return cfg.tokenizer
  key = f"{cfg.dataset}|{os.path.abspath(cfg.data_dir) if cfg.data_dir else ''}|" \
        f"{cfg.source_language}{cfg.target_language}|{cfg.grammar_train_examples}"
  return tok_lib.cache_path(cfg.dataset, key, cfg.vocab_size)


def tokenizer(cfg, corpus: Corpus, process_index: int, say=lambda s: None) -> tok_lib.Tokenizer:
  """Process 0 trains a missing tokenizer; the others wait for its file (one vocabulary)."""
  texts = lambda: (s for pair in zip(corpus.train_source, corpus.train_target) for s in pair)
  return tok_lib.shared(tokenizer_path(cfg), texts, cfg.vocab_size, process_index, say)


# --- token arrays -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Ragged:
  """Token sequences in one flat array: sequence i is flat[offsets[i]:offsets[i + 1]]."""
  flat: np.ndarray
  offsets: np.ndarray

  @staticmethod
  def of(seqs: list[list[int]]) -> "Ragged":
    lengths = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.fromiter((t for s in seqs for t in s), np.int32, int(offsets[-1]))
    return Ragged(flat, offsets)

  def __len__(self) -> int:
    return len(self.offsets) - 1

  def lengths(self) -> np.ndarray:
    return np.diff(self.offsets)

  def __getitem__(self, i: int) -> np.ndarray:
    return self.flat[self.offsets[i]:self.offsets[i + 1]]


def limit(seqs: list[list[int]], max_len: int) -> list[list[int]]:
  """Truncates to max_len tokens, keeping end-of-sentence last."""
  return [s if len(s) <= max_len else s[:max_len - 1] + [tok_lib.EOS] for s in seqs]


def filter_pairs(src: list[list[int]], tgt: list[list[int]], max_len: int, method: str
                 ) -> tuple[list[list[int]], list[list[int]]]:
  """MLPerf max_sequence_length: pairs with a side longer than max_len are discarded or
  truncated."""
  if method == "truncate":
    return limit(src, max_len), limit(tgt, max_len)
  keep = [i for i in range(len(src)) if len(src[i]) <= max_len and len(tgt[i]) <= max_len]
  return [src[i] for i in keep], [tgt[i] for i in keep]


def pack(src_len: np.ndarray, tgt_len: np.ndarray, max_len: int, order: np.ndarray
         ) -> list[np.ndarray]:
  """Greedy packing in `order`: a row takes pairs while both its sides fit in max_len."""
  rows, cur, ls, lt = [], [], 0, 0
  for i in order:
    if cur and (ls + src_len[i] > max_len or lt + tgt_len[i] > max_len):
      rows.append(np.array(cur))
      cur, ls, lt = [], 0, 0
    cur.append(i)
    ls += src_len[i]
    lt += tgt_len[i]
  if cur:
    rows.append(np.array(cur))
  return rows


def assemble(rows: list[np.ndarray], src: Ragged, tgt: Ragged, max_len: int
             ) -> dict[str, np.ndarray]:
  """Rows of (packed) pairs -> padded token, segment and position arrays."""
  out = {k: np.zeros((len(rows), max_len), np.int32) for k in TRAIN_FIELDS}
  for r, pairs in enumerate(rows):
    for side, seqs in (("inputs", src), ("targets", tgt)):
      at = 0
      for seg, i in enumerate(pairs, 1):
        ids = seqs[i]
        n = len(ids)
        out[side][r, at:at + n] = ids
        out[side + "_segment"][r, at:at + n] = seg
        out[side + "_position"][r, at:at + n] = np.arange(n)
        at += n
  return out


def describe(cfg, process_count: int = 1) -> Data | None:
  """WMT14's sizes and a batch's shapes, nothing read (compile-only runs); None for the other
  datasets, which are small and are read."""
  if cfg.dataset != "wmt14":
    return None
  rows = WMT14_TRAIN_PAIRS
  if cfg.packing:
    rows = int(WMT14_TRAIN_PAIRS * PACKED_TOKENS_PER_PAIR / cfg.max_sequence_length)
  kinds = {"": f"ids:{cfg.vocab_size}", "_segment": "one", "_position": "position"}
  train = {k: ((cfg.max_sequence_length,), np.int32, kinds[k.removeprefix("inputs")
                                                           .removeprefix("targets")])
           for k in TRAIN_FIELDS}
  evals = {"inputs": ((cfg.max_eval_length,), np.int32, f"ids:{cfg.vocab_size}"),
           "index": ((), np.int32, "index")}
  return described("wmt14 (described)", rows, WMT14_EVAL, cfg, process_count, train, evals, NAMES)


def make(cfg, process_index: int = 0, process_count: int = 1, say=lambda s: None
         ) -> tuple[Data, list[str], tok_lib.Tokenizer]:
  """(data, eval reference texts, tokenizer)."""
  corpus = read(cfg)
  tok = tokenizer(cfg, corpus, process_index, say)
  t0 = time.time()
  src, tgt = filter_pairs(tok.encode(corpus.train_source), tok.encode(corpus.train_target),
                          cfg.max_sequence_length, cfg.truncation)
  if not src:
    raise UserError(f"no training pair fits --max_sequence_length={cfg.max_sequence_length} "
                    f"with --truncation=discard")
  src_r, tgt_r = Ragged.of(src), Ragged.of(tgt)
  order = np.random.default_rng([cfg.seed, 7]).permutation(len(src_r))
  rows = (pack(src_r.lengths(), tgt_r.lengths(), cfg.max_sequence_length, order)
          if cfg.packing else [np.array([i]) for i in range(len(src_r))])
  G, L = cfg.global_batch_size, cfg.max_sequence_length
  steps = len(rows) // G
  if steps == 0:
    raise UserError(f"--global_batch_size={G} is larger than the {len(rows)} training rows of "
                    f"{corpus.name}")
  local = G // process_count
  eval_ids = limit(tok.encode(corpus.eval_source), cfg.max_eval_length)
  say(f"{corpus.name}: {len(src)} of {len(corpus.train_source)} training pairs within "
      f"{L} tokens ({cfg.truncation}), {len(rows)} rows{' packed' if cfg.packing else ''}; "
      f"{len(eval_ids)} eval sentences; tokenized in {time.time() - t0:.1f}s")

  def train(epoch: int):
    # Every process draws the same global order and keeps its share.
    perm = np.random.default_rng([cfg.seed, epoch]).permutation(len(rows))[:steps * G]
    for ids in perm.reshape(steps, process_count, local)[:, process_index]:
      yield assemble([rows[i] for i in ids], src_r, tgt_r, L)

  mine = process_indices(len(eval_ids), process_index, process_count)
  local_eval = (cfg.eval_batch_size or G) // process_count
  eval_steps = num_steps(len(eval_ids), local_eval * process_count)
  Le = cfg.max_eval_length
  eval_inputs = np.zeros((len(mine), Le), np.int32)
  for r, i in enumerate(mine):
    eval_inputs[r, :len(eval_ids[i])] = eval_ids[i]

  def evaluate():
    arrays = {"inputs": eval_inputs, "index": mine.astype(np.int32)}
    return padded(array_batches(arrays, local_eval), local_eval, eval_steps, arrays)

  data = Data(corpus.name, len(src), len(eval_ids), steps, eval_steps, train, evaluate, NAMES,
              subset=corpus.subset)
  return data, corpus.eval_target, tok



# --- a small WMT14 in the tensorflow-datasets format (tests, `./run.sh perf`) -----------------

def write_wmt14(data_dir, train: tuple[list[str], list[str]], test: tuple[list[str], list[str]]
                ) -> None:
  """wmt14_translate/de-en prepared under `data_dir` by tensorflow-datasets' own builder
  (ArrayRecord) from these (English, German) sentence lists instead of the download."""
  import tensorflow_datasets as tfds
  import tensorflow_datasets.translate  # noqa: F401

  class Wmt14(tfds.builder_cls("wmt14_translate"), skip_registration=True):
    name = "wmt14_translate"

    def _split_generators(self, dl_manager):
      return {"train": self._pairs(train), "test": self._pairs(test)}

    def _pairs(self, pairs):
      for i, (en, de) in enumerate(zip(*pairs)):
        yield i, {"en": en, "de": de}

  with tfds_temp_folders_removed():
    builder = Wmt14(config="de-en", data_dir=str(data_dir), file_format="array_record")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(data_dir)))
