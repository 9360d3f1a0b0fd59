"""WMT14 English-German from its release archives, as tensorflow-datasets'
`wmt14_translate/de-en` holds it (tfds's translate/wmt14.py and wmt.py):

  train        Europarl v7, Common Crawl and News Commentary v9, the de-en line pairs of
               training-parallel-europarl-v7.tgz, training-parallel-commoncrawl.tgz and
               training-parallel-nc-v9.tgz
  validation   newstest2013 (dev/newstest2013.{de,en} in WMT's dev.tgz)
  test         newstest2014 (dev/newstest2014-deen-src.de.sgm and -ref.en.sgm in dev.tgz),
               MLPerf's evaluation set

A text file is split at each newline (a carriage return stays in its line); SGML files give
the text of each `<seg id="N">...</seg>` line; a pair with an empty side is dropped. The
training files go in shards of at most 300,000 lines."""

from __future__ import annotations

import os
import re
from typing import Callable, Iterator

from runtime.errors import UserError
from tools.prepare import archives
from tools.prepare.shards import Shard, ShardError

PUBLISHED = {"train": 4508785, "validation": 3000, "test": 3003}
TRAIN = {  # archive -> (German file, English file) in it
    "training-parallel-europarl-v7.tgz": ("training/europarl-v7.de-en.de",
                                          "training/europarl-v7.de-en.en"),
    "training-parallel-commoncrawl.tgz": ("commoncrawl.de-en.de", "commoncrawl.de-en.en"),
    "training-parallel-nc-v9.tgz": ("training/news-commentary-v9.de-en.de",
                                    "training/news-commentary-v9.de-en.en"),
}
DEV = "dev.tgz"
VALIDATION = ("dev/newstest2013.de", "dev/newstest2013.en")
TEST = ("dev/newstest2014-deen-src.de.sgm", "dev/newstest2014-deen-ref.en.sgm")
ARCHIVE_BYTES = {"training-parallel-europarl-v7.tgz": 657632379,
                 "training-parallel-commoncrawl.tgz": 918311367,
                 "training-parallel-nc-v9.tgz": 80418416, DEV: 38654961}
LINES_PER_SHARD = 300_000
_SEG = re.compile(rb'<seg id="\d+">(.*)</seg>')


def plan(src: str, raw: str, say: Callable[[str], None]) -> list[Shard]:
  paths = archives.need(src, [*TRAIN, DEV], "statmt.org: the WMT13 and WMT14 training data, "
                        "and WMT19's dev.tgz")
  files = {}
  for archive, members in [*zip(paths, TRAIN.values()), (paths[-1], VALIDATION + TEST)]:
    wanted = {m: os.path.join(raw, os.path.basename(archive), m) for m in members}
    got = archives.extract(archive, wanted.get, os.path.join(raw, os.path.basename(archive)),
                           say)
    missing = [m for m in members if m not in got]
    if missing:
      raise UserError(f"{archive} does not hold {', '.join(missing)}: not the official archive")
    files.update(wanted)
  shards: list[tuple] = []
  for de, en in TRAIN.values():
    (de_starts, de_lines), (en_starts, en_lines) = (
        archives.line_starts(files[f], LINES_PER_SHARD) for f in (de, en))
    if de_lines != en_lines:
      raise UserError(f"{files[de]} has {de_lines:,} lines and {files[en]} {en_lines:,}: the "
                      f"two sides of a parallel corpus pair line by line; take them from the "
                      f"archive again")
    for i, (a, b) in enumerate(zip(de_starts, en_starts)):
      n = min(LINES_PER_SHARD, de_lines - i * LINES_PER_SHARD)
      shards.append(("text", files[de], a, files[en], b, n))
  out = [Shard("train", i, len(shards), s, s[-1],
               key=(s[2], s[4], s[5], archives.sizes((s[1], s[3]))))
         for i, s in enumerate(shards)]
  de, en = files[VALIDATION[0]], files[VALIDATION[1]]
  out.append(Shard("validation", 0, 1, ("text", de, 0, en, 0, 1 << 62), PUBLISHED["validation"],
                   key=archives.sizes((de, en))))
  de, en = files[TEST[0]], files[TEST[1]]
  out.append(Shard("test", 0, 1, ("sgm", de, en), PUBLISHED["test"],
                   key=archives.sizes((de, en))))
  return out


def _segments(path: str) -> list[bytes]:
  with open(path, "rb") as f:
    return [m.group(1) for m in map(_SEG.match, f) if m]


def examples(source) -> Iterator[tuple[dict, None]]:
  if source[0] == "text":
    _, de_path, de_at, en_path, en_at, n = source
    de, en = archives.read_lines(de_path, de_at, n), archives.read_lines(en_path, en_at, n)
  else:
    _, de_path, en_path = source
    de, en = _segments(de_path), _segments(en_path)
  if len(de) != len(en):
    raise ShardError(f"{de_path} and {en_path} do not pair line by line ({len(de):,} and "
                     f"{len(en):,} lines)")
  for d, e in zip(de, en):
    if not d or not e:
      continue
    try:
      yield {"de": d.decode("utf-8"), "en": e.decode("utf-8")}, None
    except UnicodeDecodeError as err:
      raise ShardError(f"{de_path} or {en_path} is not UTF-8 ({err})") from None
