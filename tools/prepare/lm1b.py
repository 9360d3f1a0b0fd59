"""lm1b (the One Billion Word benchmark, Chelba et al. 2013) from its release archive, as
tensorflow-datasets' `lm1b` holds it: one example per line, the line stripped; train from the
99 files of training-monolingual.tokenized.shuffled/news.en-*, test from the 50 files of
heldout-monolingual.tokenized.shuffled/news.en.heldout-* (tfds's lm1b builder). One shard per
training file, one for the test files."""

from __future__ import annotations

import os
import re
import shutil
from typing import Callable, Iterator

from runtime.errors import UserError
from tools.prepare import archives
from tools.prepare.shards import Shard, ShardError

ARCHIVE = "1-billion-word-language-modeling-benchmark-r13output.tar.gz"
TOP = "1-billion-word-language-modeling-benchmark-r13output"
PUBLISHED = {"train": 30301028, "test": 306688}
ARCHIVE_BYTES = {ARCHIVE: 1792209805}
TRAIN = re.compile(rf"^{TOP}/training-monolingual\.tokenized\.shuffled/"
                   r"news\.en-\d{5}-of-\d{5}$")
TEST = re.compile(rf"^{TOP}/heldout-monolingual\.tokenized\.shuffled/"
                  r"news\.en\.heldout-\d{5}-of-\d{5}$")


def plan(src: str, raw: str, say: Callable[[str], None]) -> list[Shard]:
  (archive,) = archives.need(src, [ARCHIVE], "statmt.org/lm-benchmark")

  def dest(name: str) -> str | None:
    return os.path.join(raw, os.path.basename(name)) if TRAIN.match(name) or TEST.match(name) \
        else None

  names = archives.extract(archive, dest, raw, say)
  train = sorted(os.path.join(raw, os.path.basename(n)) for n in names if TRAIN.match(n))
  test = sorted(os.path.join(raw, os.path.basename(n)) for n in names if TEST.match(n))
  if not train or not test:
    raise UserError(f"{archive} holds no {'training' if not train else 'heldout'} files under "
                    f"{TOP}/: not the official archive")
  for split, files in (("training", train), ("heldout", test)):
    if not any(os.path.getsize(p) for p in files):
      shutil.rmtree(raw)          # taken from an archive that is not the release: not kept
      raise UserError(f"{archive}: its {len(files)} {split} files are empty: not the official "
                      f"archive (even a --subset needs text in both); download it again")
  per = PUBLISHED["train"] // len(train)
  return [Shard("train", i, len(train), [p], per, key=archives.sizes([p]))
          for i, p in enumerate(train)] + \
      [Shard("test", 0, 1, test, PUBLISHED["test"], key=archives.sizes(test))]


def examples(files) -> Iterator[tuple[dict, None]]:
  for path in files:
    try:
      with open(path, encoding="utf-8") as f:
        for line in f:
          yield {"text": line.strip()}, None
    except UnicodeDecodeError as e:
      raise ShardError(f"{path} is not UTF-8 text ({e}): take it from the archive again (delete "
                       f"it)") from None
