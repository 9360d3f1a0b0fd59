"""`./run.sh prepare <dataset> --from=DIR --data_dir=DIR`: the official downloads turned into
exactly what the benchmarks read (no TensorFlow).

  imagenet   ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar [--val_labels=FILE]
             -> DIR/imagenet2012/5.1.0/ (tfds ArrayRecord)           resnet --dataset=imagenet
  coco       train2017.zip, val2017.zip, annotations_trainval2017.zip
             -> DIR/{train2017,val2017,annotations}/                 ssd --dataset=coco
  wmt14      training-parallel-{europarl-v7,commoncrawl,nc-v9}.tgz, dev.tgz
             -> DIR/wmt14_translate/de-en/1.0.0/                     transformer --dataset=wmt14
  lm1b       1-billion-word-language-modeling-benchmark-r13output.tar.gz
             -> DIR/lm1b/1.1.0/                                      lm --dataset=lm1b
  c4         MLCommons' preprocessed C4 for llama31_8b (four files), checked and linked
             -> DIR/c4-*.{idx,bin}                                   llama --dataset=c4

Worker processes (`--workers`, default the machine's cores) write shards; a progress bar shows
the rate and the time left; an interrupted preparation continues where it stopped when the
same command runs again. The counts are checked against the published ones: a dataset that
differs is refused unless `--subset` says it is meant to be a part (its runs then say so).
Nothing a run would accept exists before the whole dataset is written and checked.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys

from benchmarks import config as config_lib
from benchmarks.data import check_split
from harness import cli
from runtime import files
from runtime.errors import UserError
from tools.prepare import shards

DATASETS = ("imagenet", "coco", "wmt14", "lm1b", "c4")
# tfds names and the published counts (tools.prepare.<dataset>.PUBLISHED).
TFDS = {"imagenet": "imagenet2012", "wmt14": "wmt14_translate/de-en", "lm1b": "lm1b"}
# Disk a full preparation needs, over the archives' bytes: the dataset about as large as the
# archives (images are kept as they are; text compresses about 2.7x in the gzips), plus the
# text copied out of the archives before it is sharded.
DISK_OVER_ARCHIVES = {"imagenet": 1.05, "coco": 1.05, "wmt14": 3.0, "lm1b": 6.0}


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    raise UserError(f"./run.sh prepare: {message}; ./run.sh prepare --help")


def parse(argv: list[str]) -> argparse.Namespace:
  p = _Parser(prog="./run.sh prepare", description=__doc__.split("\n\n")[0],
              formatter_class=argparse.RawDescriptionHelpFormatter,
              epilog=__doc__.split("\n\n", 1)[1])
  p.add_argument("dataset", choices=DATASETS, help="which dataset")
  p.add_argument("--from", dest="src", required=True,
                 help="the folder holding the official downloads (unrenamed; c4: MLCommons' "
                 "four files)")
  p.add_argument("--data_dir", required=True, help="where the dataset goes: the --data_dir of "
                 "the benchmark that reads it")
  p.add_argument("--workers", type=int, default=min(32, os.cpu_count() or 1),
                 help="worker processes (default: the machine's cores, at most 32; each holds "
                 "a few hundred MB)")
  p.add_argument("--subset", action="store_true",
                 help="accept fewer examples than published (archives cut down on purpose)")
  p.add_argument("--val_labels", default=None,
                 help="imagenet: a synset per validation image (tfds's validation_labels.txt "
                 "form, image 1 first) or Kaggle's LOC_val_solution.csv; default: the file "
                 "tensorflow-datasets ships")
  a = p.parse_args(argv)
  a.src, a.data_dir = os.path.expanduser(a.src), os.path.expanduser(a.data_dir)
  return a


def _check(a: argparse.Namespace) -> None:
  if a.workers < 1:
    raise UserError(f"--workers={a.workers}: at least 1")
  if not os.path.isdir(a.src):
    raise UserError(f"--from={a.src} is not a folder: give the folder holding the downloads")
  if a.val_labels and a.dataset != "imagenet":
    raise UserError("--val_labels is imagenet's")
  config_lib.check_writable("--data_dir", a.data_dir)


def _check_disk(a: argparse.Namespace, archives: list[str], written: int) -> None:
  """Free space for the rest of the preparation (what is written already counts)."""
  have = sum(os.path.getsize(p) for p in archives if os.path.isfile(p))
  need = have * DISK_OVER_ARCHIVES[a.dataset] - written
  free = shutil.disk_usage(config_lib.nearest_existing(a.data_dir)).free
  if need > free:
    raise UserError(f"--data_dir={a.data_dir}: {free / 2**30:,.1f} GiB free, and preparing "
                    f"{a.dataset} from {have / 2**30:,.1f} GiB of archives needs about "
                    f"{need / 2**30:,.1f} GiB; free some space or choose another folder")


def _prepared(name: str, final: str) -> bool:
  """True when `final` holds the whole dataset tfds would read; a folder there that is not one
  is refused (it is the user's to remove)."""
  info = os.path.join(final, "dataset_info.json")
  if not os.path.exists(info):
    return False
  files.check_regular(info)
  try:
    with open(info, encoding="utf-8") as f:
      splits = [sp.get("name") for sp in json.load(f).get("splits", [])]
  except (OSError, ValueError, AttributeError, TypeError) as e:
    raise UserError(f"{info} is not a readable dataset_info.json ({type(e).__name__}): the "
                    f"folder is damaged; remove {final}, then run the same command again"
                    ) from None
  for split in splits:
    check_split(info, split, name, f"./run.sh prepare (after removing {final})")
  return True


def _remove_empty_folders(top: str) -> None:
  """Removes the folders under `top`, and `top`, that hold nothing."""
  for folder, _, _ in os.walk(top, topdown=False):
    try:
      os.rmdir(folder)
    except OSError:
      pass


def main(argv: list[str]) -> int:
  if any(a in ("-h", "--help") for a in argv[1:]):
    parse(["--help"])
  a = parse(argv[1:])
  _check(a)
  existed = os.path.exists(a.data_dir)
  try:
    return _prepare(a)
  except UserError:
    if not existed:           # what a refused preparation made and kept nothing in
      _remove_empty_folders(a.data_dir)
    raise


def _prepare(a: argparse.Namespace) -> int:
  module = importlib.import_module(f"tools.prepare.{a.dataset}")
  archives = [os.path.join(a.src, n) for n in module.ARCHIVE_BYTES]

  def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)

  if a.dataset == "c4":                   # already the format the benchmark reads
    module.check(a.src, a.subset, say)
    module.place(a.src, a.data_dir, say)
    print(f"prepare: done; train with ./run.sh llama --config=gpu-8xh100 --data_dir={a.data_dir} "
          f"(or --config=tpu-v5p-128; both read --dataset=c4)")
    return 0
  if a.dataset == "coco":
    if module.prepared(a.data_dir):
      say(f"prepare: COCO 2017 is already in {a.data_dir} (its annotation files are there); "
          f"nothing to do")
      return 0
    _check_disk(a, archives, module.copied_bytes(a.data_dir))
    module.prepare(a.src, a.data_dir, a.workers, a.subset, say)
    print(f"prepare: done; train with ./run.sh ssd --dataset=coco --data_dir={a.data_dir}")
    return 0
  name = TFDS[a.dataset]
  final = os.fspath(shards.builder(name, a.data_dir).data_dir)
  if _prepared(name, final):
    say(f"prepare: {name} is already in {final}; nothing to do (remove that folder to prepare "
        f"it again)")
    return 0
  _check_disk(a, archives, shards.written_bytes(a.data_dir))
  raw = os.path.join(a.data_dir, shards.WORK, "raw", a.dataset)
  if a.dataset == "imagenet":
    label_names = shards.builder(name, a.data_dir).info.features["label"].names
    plan = module.plan(a.src, a.val_labels, label_names)
  else:
    plan = module.plan(a.src, raw, say)
  folder = shards.write_tfds(name, a.data_dir, plan, f"tools.prepare.{a.dataset}",
                             module.PUBLISHED, a.workers, a.subset, say)
  if os.path.isdir(raw):
    shutil.rmtree(raw)                      # the text taken out of the archives
    shards.remove_empty(os.path.dirname(raw), os.path.join(a.data_dir, shards.WORK))
  benchmark = {"imagenet": "resnet", "wmt14": "transformer", "lm1b": "lm"}[a.dataset]
  classes = " --num_classes=1000" if a.dataset == "imagenet" else ""   # the CPU preset has 10
  print(f"prepare: done, {folder}; train with ./run.sh {benchmark} --dataset={a.dataset} "
        f"--data_dir={a.data_dir}{classes}")
  return 0


if __name__ == "__main__":
  cli.run_main(main)
