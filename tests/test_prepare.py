"""`./run.sh prepare`: small archives in the official layouts, written here (ILSVRC2012's tar of
per-synset tars and flat validation tar, COCO 2017's zips, WMT14's release tgzs and dev.tgz
with SGML, lm1b's tar.gz), turned into the folders the benchmarks read; each is then read by
the benchmark's own reader and checked against what the archives hold. A part of a dataset is
refused without --subset and its shards kept; an interrupted or failed preparation continues
where it stopped; a damaged archive is one error line."""

import gzip
import io
import json
import os
import tarfile

import numpy as np
import pytest
from PIL import Image

from harness import run as runs
from runtime.errors import UserError
from tests import downloads, helpers
from tools.prepare import cli


def _prepare(capfd, *args):
  code, out, err = helpers.run_here("tools.prepare.cli", list(args), capfd)
  return code, out, err


def _error(err):
  lines = [line for line in err.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1, err[-3000:]
  assert "Traceback" not in err
  return lines[0]


def _tfds(data_dir, name, split, decode_images=False):
  import tensorflow_datasets as tfds
  if name.startswith("wmt14"):
    import tensorflow_datasets.translate  # noqa: F401
  kw = {} if decode_images or name != "imagenet2012" else {
      "decoders": {"image": tfds.decode.SkipDecoding()}}
  src = tfds.data_source(name, split=split, data_dir=str(data_dir), download=False, **kw)
  return [src[i] for i in range(len(src))]


def test_imagenet_from_the_official_tars(tmp_path, capfd):
  src, out = tmp_path / "downloads", tmp_path / "tfds"
  src.mkdir()
  images = downloads.imagenet_tars(src, np.random.default_rng(0))
  code, _, err = _prepare(capfd, "imagenet", f"--from={src}", f"--data_dir={out}",
                          "--workers=2")
  assert code == 2
  assert "differs from the published dataset (train: 12 examples, published 1,281,167; " \
         "validation: 6 examples, published 50,000)" in _error(err)
  assert not (out / "imagenet2012").exists()          # nothing a run would accept
  code, stdout, err = _prepare(capfd, "imagenet", f"--from={src}", f"--data_dir={out}",
                               "--workers=2", "--subset")
  assert code == 0, err[-3000:]
  assert "9 of 9 shards already written" in err      # the refused run's shards, not rewritten
  assert "1 JPEG CMYK images re-encoded as RGB JPEG, 1 PNG RGB images re-encoded" in err
  assert "./run.sh resnet --dataset=imagenet" in stdout
  assert sorted(os.listdir(out)) == ["imagenet2012"]  # the work folder is gone
  train = _tfds(out, "imagenet2012", "train")
  assert sorted((r["file_name"].decode(), int(r["label"])) for r in train) == sorted(
      (f"{s}_{i}.JPEG", {"n01440764": 0, "n01443537": 1, "n15075141": 999}[s])
      for s in downloads.SYNSETS for i in range(4))
  for r in train:
    name, data = r["file_name"].decode(), r["image"]
    if name in ("n01443537_1.JPEG", "n15075141_2.JPEG"):      # CMYK, PNG: now RGB JPEGs
      im = Image.open(io.BytesIO(data))
      assert (im.format, im.mode, im.size) == ("JPEG", "RGB", (22, 18))
    else:
      assert data == images[name]                             # stored as they came
  val = _tfds(out, "imagenet2012", "validation")
  # tfds's validation_labels.txt: image 1 is n01751748 (label 65), image 2 n09193705 (970).
  labels = {r["file_name"].decode(): int(r["label"]) for r in val}
  assert labels["ILSVRC2012_val_00000001.JPEG"] == 65 and len(labels) == 6
  assert labels["ILSVRC2012_val_00000002.JPEG"] == 970
  assert all(r["image"] == images[r["file_name"].decode()] for r in val)
  # Again: nothing to do.
  code, _, err = _prepare(capfd, "imagenet", f"--from={src}", f"--data_dir={out}", "--subset")
  assert code == 0 and "already in" in err and "nothing to do" in err


@pytest.mark.slow
def test_a_run_on_a_prepared_subset_says_so(tmp_path, capfd):
  """ResNet trains on the prepared folder; its log and summary say the dataset is a part."""
  from harness import train
  src, out = tmp_path / "downloads", tmp_path / "tfds"
  src.mkdir()
  downloads.imagenet_tars(src, np.random.default_rng(1), val_images=4)
  assert _prepare(capfd, "imagenet", f"--from={src}", f"--data_dir={out}", "--workers=1",
                  "--subset")[0] == 0
  cfg = helpers.tiny_resnet(dataset="imagenet", data_dir=str(out), image_size=32,
                            num_classes=1000, global_batch_size=8, eval_batch_size=8,
                            max_epochs=1)
  run = tmp_path / "run"
  summary = train.run(runs.local("resnet", cfg, output_dir=str(run), quiet=True))
  note = ("imagenet2012 is not the published dataset: train 12 of 1,281,167 examples, "
          "validation 4 of 50,000 examples (a subset")
  assert summary["dataset_subset"].startswith(note)
  log = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(run / "result_0.txt")]
  assert [e["value"] for e in log if e["key"] == "meshperf_dataset_subset"] == [
      summary["dataset_subset"]]


def test_imagenet_val_labels_from_kaggles_csv_and_a_damaged_archive_continues(tmp_path, capfd):
  """A damaged image stops its shard, the other shards are written and kept; with the archive
  whole again the same command writes only the missing shard. A cut-off tar is refused before
  anything is written."""
  src, out = tmp_path / "downloads", tmp_path / "tfds"
  src.mkdir()
  downloads.imagenet_tars(src, np.random.default_rng(2), val_images=3)
  csv = src / "LOC_val_solution.csv"
  csv.write_text("ImageId,PredictionString\nILSVRC2012_val_00000003,n15075141 1 2 3 4 \n"
                 "ILSVRC2012_val_00000001,n01443537 1 2 3 4 n01443537 5 6 7 8\n"
                 "ILSVRC2012_val_00000002,n01440764 0 0 9 9\n")
  args = ("imagenet", f"--from={src}", f"--data_dir={out}", "--subset", f"--val_labels={csv}",
          "--workers=1")
  val = src / "ILSVRC2012_img_val.tar"
  whole = val.read_bytes()
  with tarfile.open(val) as t:
    last = t.getmembers()[-1]
  val.write_bytes(whole[:last.offset_data + last.size // 2])   # cut off in its last image
  code, _, err = _prepare(capfd, *args)
  assert code == 2 and _error(err) == (f"error: {val} is not a readable tar (ReadError: "
                                       f"unexpected end of data): download it again")
  assert not out.exists()
  val.write_bytes(whole)
  train = src / "ILSVRC2012_img_train.tar"
  good = train.read_bytes()
  with tarfile.open(train, "w") as outer:              # n01443537's second image is damaged
    with tarfile.open(fileobj=io.BytesIO(good)) as t:
      for m in t.getmembers():
        data = t.extractfile(m).read()
        if m.name == "n01443537.tar":
          b = io.BytesIO()
          with tarfile.open(fileobj=io.BytesIO(data)) as inner, \
              tarfile.open(fileobj=b, mode="w") as fixed:
            for im in inner.getmembers():
              body = inner.extractfile(im).read()
              downloads.add(fixed, im.name, b"not a jpeg" if im.name.endswith("_1.JPEG") else body)
          data = b.getvalue()
        downloads.add(outer, m.name, data)
  code, _, err = _prepare(capfd, *args)
  assert code == 2
  line = _error(err)
  assert line.startswith(f"error: n01443537.tar/n01443537_1.JPEG in {train} is not a readable "
                         f"image") and "the 5 shards written are kept" in line
  train.write_bytes(good)
  code, _, err = _prepare(capfd, *args)
  assert code == 0, err[-3000:]
  assert "5 of 6 shards already written" in err
  labels = {r["file_name"].decode(): int(r["label"]) for r in _tfds(out, "imagenet2012",
                                                                     "validation")}
  assert labels == {"ILSVRC2012_val_00000001.JPEG": 1, "ILSVRC2012_val_00000002.JPEG": 0,
                    "ILSVRC2012_val_00000003.JPEG": 999}
  assert sorted(r["file_name"].decode() for r in _tfds(out, "imagenet2012", "train")) == sorted(
      f"{s}_{i}.JPEG" for s in downloads.SYNSETS for i in range(4))


def test_imagenet_bad_val_labels(tmp_path, capfd):
  src, out = tmp_path / "downloads", tmp_path / "out"
  src.mkdir()
  downloads.imagenet_tars(src, np.random.default_rng(3), val_images=2)
  (src / "labels.txt").write_text("n01440764\ncat\n")
  code, _, err = _prepare(capfd, "imagenet", f"--from={src}", f"--data_dir={out}",
                          f"--val_labels={src / 'labels.txt'}")
  assert code == 2 and "line 2 ('cat') is not a synset" in _error(err)
  assert not out.exists()


# --- COCO ---------------------------------------------------------------------------------------

def test_coco_from_the_official_zips(tmp_path, capfd, coco):
  import pathlib
  src, out = tmp_path / "downloads", tmp_path / "coco"
  src.mkdir()
  root = pathlib.Path(coco[0])
  downloads.coco_zips(src, root)
  code, _, err = _prepare(capfd, "coco", f"--from={src}", f"--data_dir={out}")
  assert code == 2 and "COCO 2017 differs from the published dataset" in _error(err)
  assert not (out / "annotations").exists()
  # A cut-off train zip: the images copied are kept, the rerun copies the rest.
  whole = (src / "train2017.zip").read_bytes()
  (src / "train2017.zip").write_bytes(whole[:len(whole) // 2])
  code, _, err = _prepare(capfd, "coco", f"--from={src}", f"--data_dir={out}", "--subset")
  assert code == 2 and "train2017.zip is not a readable zip" in _error(err)
  (src / "train2017.zip").write_bytes(whole)
  code, _, err = _prepare(capfd, "coco", f"--from={src}", f"--data_dir={out}", "--subset",
                          "--workers=2")
  assert code == 0, err[-3000:]
  for split in ("train2017", "val2017"):
    assert sorted(os.listdir(out / split)) == sorted(os.listdir(root / split))
    for name in os.listdir(root / split):
      assert (out / split / name).read_bytes() == (root / split / name).read_bytes()
    assert json.load(open(out / "annotations" / f"instances_{split}.json")) == \
        json.load(open(root / "annotations" / f"instances_{split}.json"))
  # SSD's reader takes it.
  from benchmarks.ssd import data as ssd_data
  code, _, err = _prepare(capfd, "coco", f"--from={src}", f"--data_dir={out}", "--subset")
  assert code == 0 and "nothing to do" in err
  split = ssd_data.read_split(str(out), "val2017")
  assert len(split.images) == len(os.listdir(root / "val2017"))


# --- WMT14 --------------------------------------------------------------------------------------

def test_wmt14_from_the_release_archives(tmp_path, capfd):
  src, out = tmp_path / "downloads", tmp_path / "tfds"
  src.mkdir()
  corpora = {  # archive: (German file, English file, German lines, English lines)
      "training-parallel-europarl-v7.tgz": ("training/europarl-v7.de-en.de",
                                            "training/europarl-v7.de-en.en",
                                            ["Guten Tag", "", "Ja\r", "Nein"],
                                            ["Good day", "Empty German", "Yes\r", "No"]),
      "training-parallel-commoncrawl.tgz": ("commoncrawl.de-en.de", "commoncrawl.de-en.en",
                                            ["Haus", "Baum"], ["house", ""]),
      "training-parallel-nc-v9.tgz": ("training/news-commentary-v9.de-en.de",
                                      "training/news-commentary-v9.de-en.en",
                                      ["Straße"], ["street"]),
  }
  for archive, (de, en, de_lines, en_lines) in corpora.items():
    downloads.tgz(src / archive, {de: "\n".join(de_lines).encode() + b"\n",
                         en: "\n".join(en_lines).encode() + b"\n",
                         "training/other.fr-en.fr": b"Bonjour\n"})
  sgm = lambda lang, lines: ("<srcset>\n<doc>\n" + "".join(
      f'<seg id="{i}">{s}</seg>\n' for i, s in enumerate(lines, 1)) + "</doc>\n").encode()
  downloads.tgz(src / "dev.tgz", {"dev/newstest2013.de": b"Eins\nZwei\n",
                         "dev/newstest2013.en": b"One\nTwo\n",
                         "dev/newstest2014-deen-src.de.sgm": sgm("de", ["Hallo Welt",
                                                                        "Tschüss"]),
                         "dev/newstest2014-deen-ref.en.sgm": sgm("en", ["Hello world", "Bye"])})
  code, stdout, err = _prepare(capfd, "wmt14", f"--from={src}", f"--data_dir={out}", "--subset",
                               "--workers=2")
  assert code == 0, err[-3000:]
  pairs = lambda split: sorted((r["de"].decode(), r["en"].decode())
                               for r in _tfds(out, "wmt14_translate/de-en", split))
  # Empty sides dropped; a carriage return stays in its line (tfds's wmt.py splits at "\n").
  assert pairs("train") == sorted([("Guten Tag", "Good day"), ("Ja\r", "Yes\r"),
                                   ("Nein", "No"), ("Haus", "house"), ("Straße", "street")])
  assert pairs("validation") == [("Eins", "One"), ("Zwei", "Two")]
  assert pairs("test") == sorted([("Hallo Welt", "Hello world"), ("Tschüss", "Bye")])
  assert sorted(os.listdir(out)) == ["wmt14_translate"]   # raw text and work folder gone
  # The Transformer's reader takes it, and says it is a part.
  import dataclasses

  from benchmarks.transformer import data as tdata
  from benchmarks.transformer.config import PRESETS
  corpus = tdata.read(dataclasses.replace(PRESETS["tiny"], dataset="wmt14", data_dir=str(out)))
  assert corpus.subset == ("wmt14_translate/de-en is not the published dataset: train 5 of "
                           "4,508,785 examples, test 2 of 3,003 examples (a subset: its results "
                           "are not comparable with full-dataset runs)")


# --- lm1b ---------------------------------------------------------------------------------------

def test_lm1b_from_the_release_archive(tmp_path, capfd):
  src, out = tmp_path / "downloads", tmp_path / "tfds"
  src.mkdir()
  top = "1-billion-word-language-modeling-benchmark-r13output"
  train = {1: ["The cat sat .", "  Dogs bark . "], 2: ["Birds fly ."]}
  held = {0: ["It rains ."], 1: ["Snow falls .", ""]}
  files = {f"{top}/training-monolingual.tokenized.shuffled/news.en-{i:05d}-of-00100":
           ("\n".join(lines) + "\n").encode() for i, lines in train.items()}
  files.update({f"{top}/heldout-monolingual.tokenized.shuffled/news.en.heldout-{i:05d}-of-00050":
                ("\n".join(lines) + "\n").encode() for i, lines in held.items()})
  # A stray training file in the heldout folder, as in the real archive: not a test file.
  files[f"{top}/heldout-monolingual.tokenized.shuffled/news.en-00000-of-00100"] = b"Stray .\n"
  files[f"{top}/README"] = b"readme\n"
  downloads.tgz(src / "1-billion-word-language-modeling-benchmark-r13output.tar.gz", files)
  code, _, err = _prepare(capfd, "lm1b", f"--from={src}", f"--data_dir={out}", "--subset")
  assert code == 0, err[-3000:]
  text = lambda split: sorted(r["text"].decode() for r in _tfds(out, "lm1b", split))
  assert text("train") == sorted(["The cat sat .", "Dogs bark .", "Birds fly ."])
  assert text("test") == sorted(["It rains .", "Snow falls .", ""])
  import dataclasses

  from benchmarks.lm import data as lm_data
  from benchmarks.lm.config import PRESETS
  corpus = lm_data.read(dataclasses.replace(PRESETS["tiny"], dataset="lm1b", data_dir=str(out)))
  assert corpus.subset == ("lm1b is not the published dataset: train 3 of 30,301,028 examples, "
                           "test 3 of 306,688 examples (a subset: its results are not "
                           "comparable with full-dataset runs)")


def test_a_cut_off_gzip_is_one_error_line(tmp_path, capfd):
  src, out = tmp_path / "downloads", tmp_path / "tfds"
  src.mkdir()
  data = io.BytesIO()
  with gzip.GzipFile(fileobj=data, mode="wb") as g:
    g.write(os.urandom(200_000))
  (src / "1-billion-word-language-modeling-benchmark-r13output.tar.gz").write_bytes(
      data.getvalue()[:50_000])
  code, _, err = _prepare(capfd, "lm1b", f"--from={src}", f"--data_dir={out}")
  assert code == 2 and "cannot be read to its end" in _error(err)


def test_disk_space_is_checked_first(tmp_path, monkeypatch):
  import shutil
  from collections import namedtuple
  src = tmp_path / "downloads"
  src.mkdir()
  (src / "ILSVRC2012_img_val.tar").write_bytes(b"\0" * 1000)
  usage = namedtuple("usage", "total used free")
  monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**6, 10**6 - 100, 100))
  with pytest.raises(UserError, match="needs about"):
    cli.main(["prepare", "imagenet", f"--from={src}", f"--data_dir={tmp_path / 'out'}"])


def _marked(mark: str) -> list[int]:
  """The processes whose environment holds `mark` (a child inherits its parent's)."""
  pids = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/environ", "rb") as f:
        if mark.encode() in f.read():
          pids.append(int(pid))
    except OSError:
      continue
  return pids


def test_a_killed_preparation_leaves_no_process(tmp_path):
  """SIGKILL of `./run.sh prepare` while its workers run: none of them, nor multiprocessing's
  resource tracker, outlives it (the kernel ends them: prctl PR_SET_PDEATHSIG)."""
  import signal
  import subprocess
  import sys
  import time
  import uuid
  src = tmp_path / "downloads"
  src.mkdir()
  downloads.imagenet_tars(src, np.random.default_rng(5), val_images=2)
  mark = f"MESHPERF_TEST_MARK={uuid.uuid4().hex}"
  env = {**os.environ, mark.split("=")[0]: mark.split("=")[1]}
  p = subprocess.Popen([sys.executable, "-m", "tools.prepare.cli", "imagenet", f"--from={src}",
                        f"--data_dir={tmp_path / 'out'}", "--workers=1", "--subset"],
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.monotonic() + 120
    while len(_marked(mark)) < 2 and time.monotonic() < deadline and p.poll() is None:
      time.sleep(0.05)                     # until a worker (or the tracker) has started
    assert p.poll() is None and len(_marked(mark)) >= 2, "no worker started"
    time.sleep(1.0)                        # the worker past its start
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    deadline = time.monotonic() + 15
    while _marked(mark) and time.monotonic() < deadline:
      time.sleep(0.1)
    left = _marked(mark)
  finally:
    for pid in _marked(mark):
      os.kill(pid, signal.SIGKILL)
  assert left == [], [open(f"/proc/{pid}/cmdline").read() for pid in left if os.path.exists(
      f"/proc/{pid}")]


def _c4(folder, train_docs=40, valid_docs=12, vocab=1000):
  """MLCommons' four C4 files (Megatron indexed datasets) with random documents of token ids."""
  from benchmarks.llama import indexed
  rng = np.random.default_rng(0)
  folder.mkdir(parents=True, exist_ok=True)
  for prefix, n in ((indexed.TRAIN, train_docs), (indexed.VALIDATION, valid_docs)):
    indexed.write(str(folder / prefix), [rng.integers(1, vocab, rng.integers(20, 60),
                                                      dtype=np.int32) for _ in range(n)])


def test_c4_is_checked_linked_and_read_by_a_run(tmp_path, capfd):
  """`./run.sh prepare c4`: the four files checked (their counts reported; a part refused
  without --subset) and linked into --data_dir, where llama's --dataset=c4 reads them and says
  they are a subset."""
  import dataclasses

  from benchmarks.llama import data as llama_data
  from benchmarks.llama import indexed
  from benchmarks.llama.config import PRESETS
  src, out = tmp_path / "downloads", tmp_path / "c4"
  _c4(src)
  code, _, err = _prepare(capfd, "c4", f"--from={src}", f"--data_dir={out}")
  assert code == 2 and "holds 12 documents, not the 91,205 its name promises" in _error(err)
  assert not out.exists()
  code, got, err = _prepare(capfd, "c4", f"--from={src}", f"--data_dir={out}", "--subset")
  assert code == 0, err[-3000:]
  assert f"{indexed.VALIDATION}: 12 documents" in err and "llama --config=gpu-8xh100" in got
  for name in os.listdir(src):
    assert os.path.samefile(src / name, out / name)
  cfg = dataclasses.replace(PRESETS["tiny"], dataset="c4", data_dir=str(out), eval_samples=8,
                            max_sequence_length=32, global_batch_size=8, eval_batch_size=8)
  data = llama_data.make(cfg)
  batch = next(iter(data.train(0)))
  assert batch["inputs"].shape == (8, 32)
  assert data.subset.startswith("c4 is not the published dataset: train ") and \
      "validation 12 of 91,205 documents" in data.subset
  code, _, err = _prepare(capfd, "c4", f"--from={src}", f"--data_dir={out}", "--subset")
  assert code == 0 and "already there" in err         # again: nothing to do


@pytest.mark.parametrize("damage,needle", [
    ("missing", "lacks c4-train.en_6_text_document.bin"),
    ("cut", "a download cut short?"),
    ("id", "outside the model's --vocab_size=128,256"),
])
def test_c4_damaged_is_one_error_line_and_nothing_placed(tmp_path, capfd, damage, needle):
  from benchmarks.llama import indexed
  src, out = tmp_path / "downloads", tmp_path / "c4"
  _c4(src)
  train_bin = src / f"{indexed.TRAIN}.bin"
  if damage == "missing":
    train_bin.unlink()
  elif damage == "cut":
    train_bin.write_bytes(train_bin.read_bytes()[:-8])
  else:
    _c4(src, vocab=200_000)
  code, _, err = _prepare(capfd, "c4", f"--from={src}", f"--data_dir={out}", "--subset")
  assert code == 2 and needle in _error(err)
  assert not out.exists()
