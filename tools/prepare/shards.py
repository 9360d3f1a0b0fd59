"""A tensorflow-datasets folder written shard by shard: resumable, in worker processes.

`write_tfds` writes a registered tfds dataset (its builder's features, version and file names:
`<data_dir>/<name>/<version>/<name>-<split>.array_record-NNNNN-of-MMMMM`, `dataset_info.json`,
`features.json`) from shards whose examples a dataset module reads from the official archives.
What `tfds.data_source` reads and `benchmarks.data.open_tfds` accepts, without TensorFlow.

- Each shard is written to a temporary file and renamed when whole; a second run skips the
  shards already whole, so an interrupted preparation continues where it stopped and never
  writes an example twice.
- Work happens under `<data_dir>/.meshperf-prepare/`, out of the readers' sight: the dataset
  appears under its own name only when every split is written and its counts checked, with
  one rename.
- The counts are checked against the published ones: a dataset that differs (an incomplete or
  different archive) is refused, and its shards kept for a rerun, unless `subset` says that it
  is meant to be a part; runs on it then say so (`benchmarks.data.open_tfds`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import sys
import time
from typing import Any, Callable

from benchmarks.data import tfds_temp_folders_removed
from runtime.errors import UserError
from tools.prepare import workers as worker_pool

WORK = ".meshperf-prepare"


@dataclasses.dataclass(frozen=True)
class Shard:
  """One output file: the `index`-th of `count` of `split`, whose examples the dataset module's
  `examples(source)` yields (`source` is picklable: paths, offsets, line ranges)."""
  split: str
  index: int
  count: int
  source: Any
  expected: int = 0          # examples the plan expects in it (progress and ETA); 0: unknown
  key: Any = None            # what its content is made of (member names, sizes, labels; not
                             # where they lie in the archive); None: `source`

  def identity(self) -> str:
    """A shard written from the same identity is the same shard: a rerun keeps it."""
    what = (self.split, self.index, self.count, self.source if self.key is None else self.key)
    return hashlib.sha256(repr(what).encode()).hexdigest()


class ShardError(Exception):
  """A shard's source cannot be read as the official layout: the message says which file and
  why (a UserError in the main process)."""


def split_evenly(items: list, shards: int) -> list[list]:
  """`items` in `shards` consecutive runs whose lengths differ by at most one."""
  shards = max(1, min(shards, len(items)))
  q, r = divmod(len(items), shards)
  out, at = [], 0
  for i in range(shards):
    n = q + (i < r)
    out.append(items[at:at + n])
    at += n
  return out


def builder(name: str, data_dir: str):
  """The registered tfds builder of `name` (its features, version and file names)."""
  import tensorflow_datasets as tfds
  if name.startswith("wmt"):
    import tensorflow_datasets.translate  # noqa: F401  (registers the translation builders)
  with tfds_temp_folders_removed():
    try:
      return tfds.builder(name, data_dir=data_dir, file_format="array_record")
    except Exception as e:            # tfds raises what its readers raise (JSON, protobuf, IO)
      first = (str(e).strip().splitlines() or [""])[-1][:200]
      folder = os.path.join(data_dir, name.split("/")[0])
      raise UserError(f"{folder} is damaged: tensorflow-datasets cannot open {name} there "
                      f"({type(e).__name__}: {first}); remove {folder}, then run the same "
                      f"command again") from None


def _template(builder, split: str, folder: str):
  import tensorflow_datasets as tfds
  return tfds.core.ShardedFileTemplate(data_dir=folder, dataset_name=builder.name, split=split,
                                       filetype_suffix="array_record")


_WORKER: dict[str, Any] = {}


def _init_worker(name: str, data_dir: str, module: str) -> None:
  _WORKER["features"] = builder(name, data_dir).info.features
  _WORKER["examples"] = importlib.import_module(module).examples


def _write_shard(task: tuple[Shard, str]) -> tuple[Shard, int, int, dict, str | None]:
  """Writes one shard (in a worker): (shard, examples, bytes, notes, error or None). Any error
  (a damaged source, a full disk) leaves no file and comes back as one line."""
  from array_record.python import array_record_module
  shard, path = task
  tmp = f"{path}.tmp"
  n = nbytes = 0
  notes: dict[str, int] = {}
  try:
    writer = array_record_module.ArrayRecordWriter(tmp, "group_size:1")
    try:
      for example, note in _WORKER["examples"](shard.source):
        record = _WORKER["features"].serialize_example(example)
        writer.write(record)
        n += 1
        nbytes += len(record)
        if note:
          notes[note] = notes.get(note, 0) + 1
    finally:
      writer.close()
    with open(tmp, "rb+") as f:
      os.fsync(f.fileno())                       # whole on disk before it counts as written
    with open(f"{path}.json", "w") as f:
      json.dump({"examples": n, "bytes": nbytes, "notes": notes, "identity": shard.identity()},
                f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)                        # whole: a rerun skips it
  except Exception as e:                         # ShardError: the source's; others: the disk's
    for leftover in (tmp, f"{path}.json"):
      if os.path.exists(leftover) and not os.path.exists(path):
        os.remove(leftover)
    what = str(e) if isinstance(e, ShardError) else f"writing {path}: {type(e).__name__}: {e}"
    return shard, 0, 0, notes, what
  return shard, n, nbytes, notes, None


def _progress(total: int, what: str):
  from tqdm import tqdm
  return tqdm(total=total or None, unit=" examples", unit_scale=True, desc=what,
              file=sys.stderr, dynamic_ncols=True, mininterval=1.0, smoothing=0.1)


def written_bytes(data_dir: str) -> int:
  """Bytes already under the work folder (a resumed preparation needs that much less disk)."""
  top = os.path.join(data_dir, WORK)
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(top) for f in fs)


def write_tfds(name: str, data_dir: str, shards: list[Shard], module: str,
               published: dict[str, int], workers: int, subset: bool,
               say: Callable[[str], None]) -> str:
  """Writes the registered tfds dataset `name` (with its config, e.g. "wmt14_translate/de-en")
  under `data_dir` from `shards`, whose examples `<module>.examples(source)` yields as
  (example dict, note or None) pairs (a note counts something done to an example, e.g. "CMYK
  re-encoded"). Returns the dataset's folder. `published`: each split's published count. A
  shard already written is kept when its `Shard.identity` is the plan's (a repaired archive
  keeps the shards of its undamaged parts; a different one, or other labels, does not)."""
  b = builder(name, data_dir)
  final = os.fspath(b.data_dir)
  rel = os.path.relpath(final, data_dir)
  work = os.path.join(data_dir, WORK, rel)
  os.makedirs(work, exist_ok=True)
  splits = sorted({s.split for s in shards})
  paths = {}
  for split in splits:
    count = next(s.count for s in shards if s.split == split)
    files = _template(b, split, work).sharded_filepaths(count)
    paths.update({(split, i): os.fspath(p) for i, p in enumerate(files)})
  done = {}
  for s in shards:
    p = paths[(s.split, s.index)]
    if os.path.exists(p) and os.path.exists(f"{p}.json"):
      with open(f"{p}.json") as f:
        d = json.load(f)
      if d.get("identity") == s.identity():
        done[(s.split, s.index)] = d
  pending = [s for s in shards if (s.split, s.index) not in done]
  total = sum(s.expected for s in shards)
  if done:
    say(f"prepare: {len(done)} of {len(shards)} shards already written in {work}; "
        f"writing the other {len(pending)}")
  bar = _progress(total, rel.split(os.sep)[0])
  bar.update(sum(d["examples"] for d in done.values()))
  errors: list[str] = []
  workers = max(1, min(workers, len(pending) or 1))
  t = time.monotonic()
  try:
    tasks = [(s, paths[(s.split, s.index)]) for s in pending]
    for shard, n, nbytes, notes, error in worker_pool.results(
        _write_shard, tasks, workers, errors, initializer=_init_worker,
        initargs=(name, data_dir, module)):
      if error:
        errors.append(error)
        continue
      done[(shard.split, shard.index)] = {"examples": n, "bytes": nbytes, "notes": notes}
      bar.update(n)
  finally:
    bar.close()
  if errors:
    raise UserError(f"{worker_pool.first(errors, ' shards')}; the {len(done)} shards written are "
                    f"kept in {work}: mend what is said (or lower --workers) and run the same "
                    f"command again: it continues")
  counts = {split: sum(d["examples"] for (sp, _), d in done.items() if sp == split)
            for split in splits}
  notes: dict[str, int] = {}
  for d in done.values():
    for k, v in d["notes"].items():
      notes[k] = notes.get(k, 0) + v
  say(f"prepare: {', '.join(f'{split} {counts[split]:,}' for split in splits)} examples "
      f"({time.monotonic() - t:.0f} s)" + (f"; {', '.join(f'{v:,} {k}' for k, v in notes.items())}"
                                            if notes else ""))
  empty = [s for s in splits if not counts[s]]
  if empty:
    raise UserError(f"{name}: the {empty[0]} split has no examples: the archives are not the "
                    f"official ones (a --subset is fewer examples, never none); the shards are "
                    f"kept in {work}")
  differ = {s: (counts[s], published[s]) for s in splits if counts[s] != published.get(s)}
  if differ and not subset:
    what = "; ".join(f"{s}: {have:,} examples, published {want:,}" for s, (have, want) in
                     differ.items())
    raise UserError(f"{name} differs from the published dataset ({what}): the archives are "
                    f"incomplete or not the official ones. Check them, or add --subset to "
                    f"prepare a part on purpose (its runs say so); the shards are kept in {work}")
  _finish(b, splits, done, paths, work, final)
  remove_empty(os.path.dirname(work), os.path.join(data_dir, WORK))
  return final


def remove_empty(folder: str, top: str) -> None:
  """Removes `folder` and its parents up to `top` while they are empty."""
  top = os.path.abspath(top)
  folder = os.path.abspath(folder)
  while folder.startswith(top):
    try:
      os.rmdir(folder)
    except OSError:
      return
    if folder == top:
      return
    folder = os.path.dirname(folder)


def _finish(builder, splits, done, paths, work: str, final: str) -> None:
  """dataset_info.json and features.json beside the shards and nothing else there (files of
  an earlier plan, a killed worker's temporary files), the folder put in place, then the
  shards' notes removed from it (kept until then: a failure before the rename keeps every
  shard counted as written)."""
  import tensorflow_datasets as tfds
  if os.path.exists(final):
    raise UserError(f"{final} exists but is not a dataset tfds wrote (no dataset_info.json): "
                    f"remove it, then run the same command again (the shards in {work} are "
                    f"kept)")
  infos = []
  for split in splits:
    keys = sorted(k for k in done if k[0] == split)
    infos.append(tfds.core.SplitInfo(
        name=split, shard_lengths=[done[k]["examples"] for k in keys],
        num_bytes=sum(done[k]["bytes"] for k in keys),
        filename_template=_template(builder, split, final)))
  shards = {os.path.basename(paths[k]) for k in done}
  notes = {f"{f}.json" for f in shards}
  for f in os.listdir(work):
    if f not in shards | notes:
      os.remove(os.path.join(work, f))
  builder.info.set_splits(tfds.core.SplitDict(infos))
  builder.info.write_to_directory(work)
  os.makedirs(os.path.dirname(final), exist_ok=True)
  os.replace(work, final)
  for f in notes:
    os.remove(os.path.join(final, f))
