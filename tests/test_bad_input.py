"""The bad-input catalogue: every kind of bad input a user can hand each entry point.

The promise, checked for every case: exit status 2; exactly one stderr line starting `error: `,
which says what is wrong (the case's needle); no traceback and no usage page; and nothing left
behind: the --output_dir is not made, and no file or folder appears under the test's folder
(the runs start there, so their default runs/ would land in it; their TMPDIR is there too),
or in the datasets the cases read; the tokenizer cache may only gain a finished tokenizer.
Datasets are built here in their real formats (tfds ArrayRecord, COCO layout, sentencepiece,
MLPerf logs) with the builders of the data tests, then damaged.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from benchmarks.common import grammar, weights
from benchmarks.lm.data import write_lm1b
from benchmarks.registry import BENCHMARKS
from benchmarks.transformer.data import write_wmt14
from runtime.errors import UserError
from tests import downloads, helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERBS = {"main": [sys.executable, "-m", "harness.main"],
         "ablate": [sys.executable, "-m", "tools.sweep.ablate"],
         "sweep": [sys.executable, "-m", "tools.sweep"],
         "scale": [sys.executable, "-m", "tools.pod.scale"],
         "throughput": [sys.executable, "-m", "tools.perf.synthetic"],
         "prepare": [sys.executable, "-m", "tools.prepare.cli"],
         "dryrun": [sys.executable, "-m", "tools.pod.dryrun"],
         "run.sh": [os.path.join(ROOT, "run.sh")]}
# The same entry points called in this process (`tests.helpers.run_here`: each parses its flags
# on a fresh set of its own, and ends as `run_main` ends): about 0.1-1 s a case instead of a
# Python process that imports jax (4-6 s).
IN_PROCESS = {"main": "harness.main", "ablate": "tools.sweep.ablate",
              "sweep": "tools.sweep.cli", "scale": "tools.pod.scale",
              "throughput": "tools.perf.synthetic", "prepare": "tools.prepare.cli",
              "dryrun": "tools.pod.dryrun"}
# What a case in this process cannot do: the shell script; simulated devices other than this
# process's 8 (jax starts once per process); libtpu's TPU topologies; multi-host starts; XLA
# flags (XLA reads them when jax starts), which the GPU presets set.
OWN_PROCESS_FLAGS = ("--num_cpu_devices", "--topology", "--coordinator_address",
                     "--num_processes", "--process_id", "--xla_flags", "--config=gpu")
# SSD on a COCO folder: a model and batch that would pass every other check. One device and
# eval batches of one image: the damaged validation image (the third) is not in the first eval
# batch, which the setup reads for shapes, so without the early check it is found only at the
# first evaluation, after training (and the log written).
SSD_COCO = ["--dataset=coco", "--num_cpu_devices=1", "--global_batch_size=4",
            "--eval_batch_size=1"]


def _mllog(key, value, time_ms=1):
  return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": time_ms, "event_type":
                                   "POINT_IN_TIME", "key": key, "value": value, "metadata": {}})


def _damage_info(folder):
  """A tfds folder whose dataset_info.json is garbage (the ArrayRecord files intact)."""
  [info] = [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs
            if f == "dataset_info.json"]
  with open(info, "w") as f:
    f.write('{"name": "half written", "splits": [{"na')
  return str(folder)


def _unwritable(base):
  """A folder no file can be made in: permission bits for a normal user; for root, who ignores
  them, a path under /proc (a virtual file system that takes no new files)."""
  if os.geteuid() == 0:
    return "/proc/meshperf-bad-input"
  base.mkdir()
  base.chmod(0o500)
  return str(base)


def _downloads(root, coco_root):
  """Official downloads (`tests/downloads.py`), each folder with one defect: {name: folder}."""
  import pathlib
  import tarfile
  import zipfile
  rng = np.random.default_rng(0)
  d = {}

  def imagenet(name):
    folder = root / name
    folder.mkdir()
    downloads.imagenet_tars(folder, rng, val_images=3)
    d[name] = str(folder)
    return folder / "ILSVRC2012_img_train.tar", folder / "ILSVRC2012_img_val.tar"

  train, _ = imagenet("imagenet_cut_header")
  with tarfile.open(train) as t:
    second = t.getmembers()[1]
  train.write_bytes(train.read_bytes()[:second.offset + 100])     # inside its second header
  _, val = imagenet("imagenet_val_twice")
  with tarfile.open(val, "a") as t:
    downloads.add(t, "ILSVRC2012_val_00000002.JPEG", downloads.image(rng))
  train, _ = imagenet("imagenet_synset_twice")
  with tarfile.open(train) as t:
    again = t.extractfile("n01443537.tar").read()
  with tarfile.open(train, "a") as t:
    downloads.add(t, "n01443537.tar", again)
  _, val = imagenet("imagenet_link")
  with tarfile.open(val, "a") as t:
    link = tarfile.TarInfo("ILSVRC2012_val_00000004.JPEG")
    link.type, link.linkname = tarfile.SYMTYPE, "ILSVRC2012_val_00000001.JPEG"
    t.addfile(link)
  _, val = imagenet("imagenet_empty_val")
  with tarfile.open(val, "w"):
    pass
  for name in ("coco_climb", "coco_elsewhere", "coco_list", "coco_no_file_name"):
    (root / name).mkdir()
    downloads.coco_zips(root / name, pathlib.Path(coco_root))
    d[name] = str(root / name)
  with zipfile.ZipFile(root / "coco_climb" / "train2017.zip", "a") as z:
    z.writestr("train2017/../../../../coco-evil.jpg", downloads.image(rng))
  with zipfile.ZipFile(root / "coco_elsewhere" / "train2017.zip", "w") as z:
    for f in sorted(os.listdir(os.path.join(coco_root, "train2017"))):
      z.write(os.path.join(coco_root, "train2017", f), f"images/{f}")
  for name, edit in (("coco_list", lambda a: a["images"]),
                     ("coco_no_file_name", lambda a: {**a, "images": [
                         {k: v for k, v in im.items() if k != "file_name"} if i == 1 else im
                         for i, im in enumerate(a["images"])]})):
    path = root / name / "annotations_trainval2017.zip"
    with zipfile.ZipFile(path) as z:
      files = {n: z.read(n) for n in z.namelist()}
    key = "annotations/instances_train2017.json"
    files[key] = json.dumps(edit(json.loads(files[key]))).encode()
    with zipfile.ZipFile(path, "w") as z:
      for n, data in files.items():
        z.writestr(n, data)
  top = "1-billion-word-language-modeling-benchmark-r13output"
  (root / "lm1b_empty_heldout").mkdir()
  downloads.tgz(root / "lm1b_empty_heldout" / f"{top}.tar.gz", {
      f"{top}/training-monolingual.tokenized.shuffled/news.en-00001-of-00100": b"A cat .\n",
      f"{top}/heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050": b""})
  d["lm1b_empty_heldout"] = str(root / "lm1b_empty_heldout")
  return d


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, coco, imagenet_dir):
  """Damaged inputs by name (the cases' {placeholders}), built once for the module."""
  root = tmp_path_factory.mktemp("inputs")
  d = {"root": str(root)}
  # tfds ArrayRecord datasets that tensorflow-datasets' own builders wrote, then damaged.
  en, de = grammar.corpus(40, 5)
  write_wmt14(root / "wmt14", (en[:30], de[:30]), (en[30:], de[30:]))
  d["wmt14_garbage"] = _damage_info(root / "wmt14")
  write_lm1b(root / "lm1b", en[:30], en[30:])
  d["lm1b_garbage"] = _damage_info(root / "lm1b")
  d["imagenet_garbage"] = _damage_info(shutil.copytree(imagenet_dir, root / "imagenet"))
  # COCO-layout folders (the SSD data tests' own), each with one defect.
  coco_root = coco[0]
  for name in ("coco_width0", "coco_cut_jpeg", "coco_missing_jpeg"):
    d[name] = str(shutil.copytree(coco_root, root / name))
  path = root / "coco_width0" / "annotations" / "instances_train2017.json"
  train = json.loads(path.read_text())
  train["images"][1]["width"] = 0
  path.write_text(json.dumps(train))
  val = json.loads((root / "coco_cut_jpeg" / "annotations" / "instances_val2017.json").read_text())
  d["val_jpeg"], d["val_id"] = val["images"][2]["file_name"], val["images"][2]["id"]
  jpeg = root / "coco_cut_jpeg" / "val2017" / d["val_jpeg"]
  jpeg.write_bytes(jpeg.read_bytes()[:jpeg.stat().st_size // 2])   # a copy cut short
  (root / "coco_missing_jpeg" / "val2017" / d["val_jpeg"]).unlink()
  # Annotations a run would read wrong: a NaN box, a validation image listed twice; and a
  # training image (one with objects, so the run would read it) gone from its folder.
  for name in ("coco_nan_box", "coco_twice", "coco_missing_train"):
    d[name] = str(shutil.copytree(coco_root, root / name))
  path = root / "coco_nan_box" / "annotations" / "instances_train2017.json"
  train = json.loads(path.read_text())
  train["annotations"][3]["bbox"][2] = float("nan")
  d["nan_annotation"] = train["annotations"][3]["id"]
  path.write_text(json.dumps(train))      # NaN: the JSON extension Python and COCO tools read
  path = root / "coco_twice" / "annotations" / "instances_val2017.json"
  val = json.loads(path.read_text())
  val["images"].append(dict(val["images"][1]))
  d["twice_id"] = val["images"][1]["id"]
  path.write_text(json.dumps(val))
  with_objects = {a["image_id"] for a in train["annotations"]}
  gone = next(im for im in train["images"] if im["id"] in with_objects)
  (root / "coco_missing_train" / "train2017" / gone["file_name"]).unlink()
  d["train_jpeg"] = gone["file_name"]
  d["imagenet"] = str(imagenet_dir)
  # MLCommons' C4 layout (Megatron's indexed files): token ids stored as float32; an id past
  # the vocabulary deep in the training file, after the rows of the first batch.
  from benchmarks.llama import indexed
  rng = np.random.default_rng(1)
  for name, dtype in (("c4_float", np.float32), ("c4_big_id", np.int32)):
    (root / name).mkdir()
    for prefix in (indexed.TRAIN, indexed.VALIDATION):
      docs = [rng.integers(1, 1000, size=300) for _ in range(40)]
      if name == "c4_big_id" and prefix == indexed.TRAIN:
        docs[37][5] = 5000
      indexed.write(str(root / name / prefix), docs, dtype)
    d[name] = str(root / name)
  d.update(_downloads(root, coco_root))
  # Files that are not what a flag wants.
  (root / "notes.txt").write_text("a text file, not a sentencepiece model or a log\n")
  d["text_file"] = str(root / "notes.txt")
  (root / "folder").mkdir()
  d["folder"] = str(root / "folder")
  (root / "garbage.npz").write_bytes(b"not a zip archive" * 10)
  d["garbage_npz"] = str(root / "garbage.npz")
  stem_only = {"params": {"stem": {"kernel": np.zeros((7, 7, 3, 4), np.float32)},
                          "BatchNorm_0": {"scale": np.ones(4, np.float32)}, "Block_0": {}},
               "batch_stats": {"BatchNorm_0": {"mean": np.zeros(4, np.float32)}}}
  stem_only["params"]["Block_0"] = {"Conv_0": {"kernel": np.zeros((1, 1, 4, 4), np.float32)}}
  weights.save_npz(stem_only, str(root / "resnet_block0.npz"))
  d["resnet_block0_npz"] = str(root / "resnet_block0.npz")
  d["unwritable"] = _unwritable(root / "readonly")
  # Plain-text corpora with one defect each.
  (root / "uneven").mkdir()
  (root / "uneven" / "train.en").write_text("".join(s + "\n" for s in en))
  (root / "uneven" / "train.de").write_text("".join(s + "\n" for s in de[:-1]))
  # Text that is not UTF-8 (Latin-1 umlauts), and a folder where a corpus file belongs.
  (root / "latin1").mkdir()
  for split, lang in (("train", "en"), ("train", "de"), ("dev", "en"), ("dev", "de")):
    (root / "latin1" / f"{split}.{lang}").write_text("ein satz\n", encoding="utf-8")
  (root / "latin1" / "train.de").write_bytes("ein satz\nf\u00fcr m\u00fcnchen\n".encode("latin-1"))
  (root / "en_folder").mkdir()
  (root / "en_folder" / "train.en").mkdir()
  (root / "latin1_lm").mkdir()
  (root / "latin1_lm" / "train.txt").write_bytes("gr\u00fc\u00dfe\n".encode("latin-1"))
  (root / "latin1_lm" / "eval.txt").write_text("a sentence\n")
  # Output paths that can never be made: a dangling link, a loop of links, a name too long.
  (root / "dangling").symlink_to(root / "no-such-target")
  (root / "loop_a").symlink_to(root / "loop_b")
  (root / "loop_b").symlink_to(root / "loop_a")
  (root / "empty_lm").mkdir()
  (root / "empty_lm" / "train.txt").write_text("\n\n")
  (root / "empty_lm" / "eval.txt").write_text("a sentence\n")
  # MLPerf logs: one a crash cut mid-line, one edited, one of a benchmark meshperf lacks.
  lines = [_mllog("submission_benchmark", "resnet"), _mllog("init_start", None, 2),
           _mllog("seed", 0, 3)]
  (root / "logs").mkdir()
  (root / "logs" / "cut").mkdir()
  (root / "logs" / "cut" / "result_0.txt").write_text("\n".join(lines)[:-25])
  (root / "logs" / "edited.txt").write_text("\n".join([lines[0], lines[1][:40], lines[2]]) + "\n")
  (root / "logs" / "bert.txt").write_text(_mllog("submission_benchmark", "bert") + "\n")
  (root / "logs" / "empty").mkdir()
  # The folder of a sweep of other settings (tools/sweep/state.py: its state's first line).
  (root / "sweep").mkdir()
  (root / "sweep" / "sweep.jsonl").write_text(json.dumps({"sweep": {
      "benchmark": "resnet", "depth": "throughput", "steps": 7, "rounds": 3}}) + "\n")
  d["other_sweep"] = str(root / "sweep")
  # Points files for `./run.sh scale --points`, each with one defect.
  point = {"name": "p", "benchmark": "resnet", "preset": "tpu-v3-2048", "topology": "v3:4x4",
           "mesh": "x:8,y:4", "global_batch_size": 4096, "train_steps": 10}
  for name, change in (("bert", {"benchmark": "bert"}), ("topology", {"topology": "v9:4x4"}),
                       ("batch", {"global_batch_size": 100}), ("mesh", {"mesh": "x:8,y:8"}),
                       ("steps", {"train_steps": None}), ("field", {"overrides": {"bogus": 1}}),
                       ("dimension", {"overrides": {"layout": "bacth:x+y"}}),
                       ("mesh_type", {"mesh": 5}), ("batch_type", {"global_batch_size": "big"}),
                       ("measured_type", {"measured": [1]}), ("source_type", {"source": 5}),
                       ("facts_type", {"facts": "x"}),
                       ("width_type", {"overrides": {"model_width": "wide"}})):
    bad = {k: v for k, v in {**point, **change}.items() if v is not None}
    (root / f"points_{name}.json").write_text(json.dumps({"points": [bad]}))
    d[f"points_{name}"] = str(root / f"points_{name}.json")
  (root / "points_latin1.json").write_bytes(json.dumps({"points": [{**point, "notes": "\u00fc"}]},
                                                       ensure_ascii=False).encode("latin-1"))
  d["points_latin1"] = str(root / "points_latin1.json")
  # A finished run's folder (its log and summary), and files that are FIFOs: a reader that
  # opened one would wait for a writer forever.
  whole = "\n".join([_mllog("submission_benchmark", "resnet"), _mllog("run_start", None, 2),
                     _mllog("run_stop", None, 3)]) + "\n"
  for name in ("finished_run", "fifo_summary_run", "fifo_log"):
    (root / name).mkdir()
  (root / "finished_run" / "result_0.txt").write_text(whole)
  (root / "finished_run" / "summary.json").write_text("{}")
  (root / "fifo_summary_run" / "result_0.txt").write_text(whole)
  os.mkfifo(root / "fifo_summary_run" / "summary.json")
  os.mkfifo(root / "fifo_log" / "result_0.txt")
  os.mkfifo(root / "fifo.txt")
  yield d
  if os.geteuid() != 0:
    os.chmod(d["unwritable"], 0o700)


CASES = [
    # --- moved from test_cli.py: mesh, layout, batch, dataset, preset, flags, optimizations ----
    ("main", ["resnet", "--mesh=data:3"], "has 3 devices but 8 are available"),
    ("main", ["resnet", "--mesh=data"], "must be name:value"),
    ("main", ["resnet", "--mesh=data:-1,model:-1"], "more than once"),
    ("main", ["resnet", "--layout=batch:model"], "names mesh axis 'model'"),
    ("main", ["resnet", "--layout=batch:data;;"], "empty entry"),
    ("main", ["resnet", "--kernel_layout=OIHW"], "--kernel_layout=OIHW: choose one of HWIO, OHWI"),
    ("main", ["ssd", "--pool_backward=scan"], "--pool_backward=scan: choose one of xla, index"),
    ("main", ["resnet", "--relu_backward=input"],
     "--relu_backward=input: choose one of output, mask"),
    ("main", ["resnet", "--bn_flat"], "--bn_flat keeps every batch norm's stacked"),
    ("main", ["resnet", "--mesh=data:4,model:2",
              "--layout=batch:data;in_channels:model;channels:model"],
     "both split over mesh axis 'model'"),
    ("main", ["resnet", "--mesh=data:4,model:2", "--layout=batch:data;channels:model",
              "--model_width=3"], "not divisible by mesh axes model"),
    ("main", ["resnet", "--global_batch_size=60"], "--global_batch_size=60 is not divisible"),
    ("main", ["resnet", "--dataset=imagenet", "--data_dir=/nonexistent"], "does not exist"),
    ("main", ["resnet", "--dataset=cifar"], "--dataset=cifar: choose one of"),
    ("main", ["resnet", "--data_loader=torch"], "--data_loader=torch: choose one of grain, dali"),
    ("main", ["resnet", "--data_loader=dali"], "--data_loader=dali reads ImageNet's JPEGs"),
    ("main", ["resnet", "--config=tpu-v9"], "unknown --config 'tpu-v9'"),
    ("main", ["resnet", "--model_depth=51"], "--model_depth=51: choose one of"),
    ("main", ["bert"], "unknown benchmark 'bert'; choose one of resnet, transformer, ssd"),
    ("main", [], "name a benchmark"),
    ("main", ["resnet", "--adam_beta1=0.5"], "--adam_beta1 is a flag of transformer"),
    ("main", ["resnet", "--no_such_flag=1"],
     "unknown flag --no_such_flag; `./run.sh resnet --help`"),
    ("main", ["resnet", "--global_batch_size=abc"], "--global_batch_size=abc: expects an integer"),
    ("main", ["resnet", "--base_learning_rate=fast"],
     "--base_learning_rate=fast: expects a number"),
    ("main", ["ssd", "--eval_epochs=4,x"], "--eval_epochs=4,x: expects comma-separated integers"),
    ("main", ["ssd", "--aspect_ratios=2;a"], "--aspect_ratios=2;a: expects ';'-separated groups"),
    ("main", ["resnet", "extra"], "unexpected argument 'extra'"),
    ("main", ["resnet", "--optimizations=grad_accum:0"],
     "grad_accum needs the number of micro-batches"),
    ("main", ["resnet", "--optimizations=turbo"], "unknown optimization 'turbo'"),
    ("main", ["resnet", "--optimizations=grad_sum_2d"], "needs the batch split over two mesh axes"),
    ("main", ["transformer", "--dataset=text"], "reads --data_dir, which is not set"),
    ("main", ["transformer", "--dataset=text", f"--data_dir={ROOT}"], "train.en is missing"),
    ("main", ["transformer", "--config=cpu-model", "--num_heads=6", "--d_kv=16"],
     "not divisible by mesh axes model"),
    ("main", ["transformer", "--vocab_size=5000"], "choose a smaller --vocab_size"),
    ("main", ["transformer", "--truncation=cut"], "--truncation=cut: choose discard or truncate"),
    ("main", ["ssd", "--dataset=coco"], "--dataset=coco needs --data_dir"),
    ("main", ["ssd", "--extra_blocks=2,3,2,2"], "each entry is 2 (stride 2) or 0 (unpadded)"),
    ("main", ["ssd", "--extra_blocks=2,2,0,0"], "--image_size=128: image size 128 is too small"),
    # --- the cases --------------------------------------------------------------------
    ("run.sh", ["ssd", "--aspect_ratios=2;;;;"], "--aspect_ratios=2;;;;: group 2 is empty"),
    ("main", ["transformer", "--dataset=wmt14", "--data_dir={wmt14_garbage}"],
     "dataset_info.json is not a readable dataset_info.json (JSONDecodeError"),
    ("main", ["lm", "--dataset=lm1b", "--data_dir={lm1b_garbage}"],
     "the folder is damaged: prepare lm1b again with `./run.sh prepare lm1b --from="),
    ("main", ["resnet", "--dataset=imagenet", "--data_dir={imagenet_garbage}"],
     "the folder is damaged: prepare imagenet2012 again"),
    ("main", ["ssd", *SSD_COCO, "--data_dir={coco_width0}"], "has width 0; COCO image records"),
    ("main", ["transformer", "--tokenizer={text_file}"],
     "tokenizer {text_file} is not a sentencepiece model"),
    ("main", ["lm", "--tokenizer={text_file}"], "is not a sentencepiece model"),
    ("main", ["transformer", "--tokenizer={folder}"], "tokenizer {folder} is a folder"),
    ("main", ["lm", "--tokenizer={unwritable}/spm.model"],
     "--tokenizer={unwritable}/spm.model: cannot write in"),
    ("main", ["resnet", "--output_dir={unwritable}/run"],
     "--output_dir={unwritable}/run: cannot write in"),
    ("main", ["resnet", "--output_dir={text_file}"], "--output_dir={text_file} is a file"),
    ("main", ["resnet", "--output_dir={text_file}/run"], "is a file, so nothing can be made under"),
    ("run.sh", ["check", "{root}/logs/cut"], "its last line (line 3) is cut off mid-record"),
    ("run.sh", ["check", "{root}/logs/edited.txt"], "line 2 is not a whole MLLOG record"),
    ("run.sh", ["check", "{text_file}"], "is not an MLPerf log (no :::MLLOG lines)"),
    ("run.sh", ["check", "{root}/logs/bert.txt"], "no known submission_benchmark in the log"),
    ("run.sh", ["check", "{root}/logs/empty"], "no result_*.txt under"),
    ("run.sh", ["check"], "./run.sh check takes one PATH"),
    ("run.sh", ["check", "{text_file}", "{text_file}"], "./run.sh check takes one PATH"),
    ("run.sh", [], f"./run.sh needs a verb: a benchmark ({', '.join(BENCHMARKS)}), test, check"),
    ("run.sh", ["--config=tiny"], "the first word is a verb"),
    ("run.sh", ["install", "rocm"], "./run.sh install takes tpu, cuda12, cuda13 or dali"),
    ("run.sh", ["throughput", "llama", "--config=gpu-8xh100"],
     "--config=gpu-8xh100 is a preset for 8 GPU devices (h100); this machine has"),
    ("main", ["resnet", "--coordinator_address=127.0.0.1:23456", "--num_processes=2",
              "--process_id=2"], "--process_id=2: choose 0..1 (--num_processes=2)"),
    ("main", ["resnet", "--num_processes=0"], "--num_processes=0: at least 1"),
    ("main", ["resnet", "--process_id=1"], "--process_id=1 needs --coordinator_address=HOST:PORT"),
    ("main", ["resnet", "--num_processes=4", "--process_id=0"],
     "--num_processes=4 needs --coordinator_address"),
    ("main", ["resnet", "--coordinator_address=host0", "--num_processes=2", "--process_id=0"],
     "--coordinator_address=host0: write HOST:PORT"),
    ("main", ["resnet", "--coordinator_address=127.0.0.1:23456"],
     "--coordinator_address needs --num_processes and --process_id"),
    ("main", ["resnet", "--xla_flags=xla_gpu_foo"], "'xla_gpu_foo' is not an XLA flag"),
    ("main", ["resnet", "--xla_flags=--xla_no_such_flag=1"],
     "does not know --xla_no_such_flag=1; drop it"),
    ("main", ["resnet", "--libtpu_flags=xla_tpu_foo"], "'xla_tpu_foo' is not a libtpu flag"),
    ("main", ["resnet", "--coordinator_address=auto", "--process_id=0"],
     "the TPU pod numbers its processes itself"),
    ("ablate", ["resnet", "--no_such_flag=1"], "unknown flag --no_such_flag"),
    ("prepare", ["imagenet", "--from={root}", "--data_dir={out}"],
     "--from={root} lacks ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar (from image-net.org"),
    ("prepare", ["coco", "--from={root}", "--data_dir={out}"],
     "lacks train2017.zip, val2017.zip, annotations_trainval2017.zip"),
    ("prepare", ["wmt14", "--from={text_file}", "--data_dir={out}"],
     "--from={text_file} is not a folder"),
    ("prepare", ["imagenet", "--from={root}", "--data_dir={out}", "--workers=0"],
     "--workers=0: at least 1"),
    ("prepare", ["cifar", "--from={root}", "--data_dir={out}"], "invalid choice: 'cifar'"),
    ("prepare", ["lm1b", "--data_dir={out}"], "the following arguments are required: --from"),
    ("prepare", ["coco", "--from={root}", "--data_dir={out}", "--val_labels=x"],
     "--val_labels is imagenet's"),
    ("prepare", ["lm1b", "--from={root}", "--data_dir={unwritable}/x"],
     "--data_dir={unwritable}/x: cannot write in"),
    # An archive that is not the download it claims to be, even under --subset (issue:
    # reliability, third round): refused before anything a run would read is written.
    ("prepare", ["imagenet", "--from={imagenet_cut_header}", "--data_dir={out}", "--subset"],
     "{imagenet_cut_header}/ILSVRC2012_img_train.tar is cut off or damaged: its listing stops "
     "at byte"),
    ("prepare", ["imagenet", "--from={imagenet_val_twice}", "--data_dir={out}", "--subset"],
     "ILSVRC2012_img_val.tar: member ILSVRC2012_val_00000002.JPEG is there twice"),
    ("prepare", ["imagenet", "--from={imagenet_synset_twice}", "--data_dir={out}", "--subset"],
     "ILSVRC2012_img_train.tar: member n01443537.tar is there twice"),
    ("prepare", ["imagenet", "--from={imagenet_link}", "--data_dir={out}", "--subset"],
     "member ILSVRC2012_val_00000004.JPEG is a link to ILSVRC2012_val_00000001.JPEG"),
    ("prepare", ["imagenet", "--from={imagenet_empty_val}", "--data_dir={out}", "--subset"],
     "{imagenet_empty_val}/ILSVRC2012_img_val.tar holds no images"),
    ("prepare", ["coco", "--from={coco_climb}", "--data_dir={out}", "--subset"],
     "{coco_climb}/train2017.zip: member train2017/../../../../coco-evil.jpg leaves the zip's"),
    ("prepare", ["coco", "--from={coco_elsewhere}", "--data_dir={out}", "--subset"],
     "{coco_elsewhere}/train2017.zip holds no images train2017/<name>.jpg (its first file is "
     "images/"),
    ("prepare", ["coco", "--from={coco_list}", "--data_dir={out}", "--subset"],
     "annotations/instances_train2017.json in {coco_list}/annotations_trainval2017.zip is not "
     "COCO's instances file"),
    ("prepare", ["coco", "--from={coco_no_file_name}", "--data_dir={out}", "--subset"],
     "instances_train2017.json in {coco_no_file_name}/annotations_trainval2017.zip: image 1"),
    ("prepare", ["lm1b", "--from={lm1b_empty_heldout}", "--data_dir={out}", "--subset"],
     "its 1 heldout files are empty: not the official archive"),
    ("prepare", ["lm1b", "--from={root}", "--data_dir={lm1b_garbage}"],
     "{lm1b_garbage}/lm1b is damaged: tensorflow-datasets cannot open lm1b there (ParseError"),
    ("prepare", ["imagenet", "--from={imagenet_val_twice}", "--data_dir={out}",
                 "--val_labels={root}/fifo.txt"], "{root}/fifo.txt is a FIFO (named pipe)"),
    ("throughput", ["resnet", "--config=tiny"],
     "--dataset=digits is read, not described: the throughput check runs a hardware preset"),
    ("throughput", ["resnet", "--config=gpu-8xh100", "--steps=0"], "--steps=0: timed steps"),
    ("throughput", ["resnet", "--config=tpu-v4-128", "--fit_devices"],
     "--mesh=data:-1 --layout=batch:data is not: give --mesh and the batch sizes yourself"),
    ("throughput", ["all", "--config=cpu-model"],
     "./run.sh throughput all needs --config=NAME, a hardware preset that benchmarks have"),
    ("throughput", ["resnet", "--config=gpu-8xh100", "--compile_only"],
     "./run.sh throughput runs steps on this machine's devices"),
    ("ablate", ["resnet", "--ablate_steps=abc"], "--ablate_steps=abc: expects an integer"),
    ("ablate", ["resnet", "--ablate_steps=-1"], "--ablate_steps=-1: timed steps per variant"),
    ("ablate", ["resnet", "--ablate_rounds=0"], "--ablate_rounds=0: at least 1"),
    ("ablate", ["resnet", "--ablate_json={text_file}/ablate.json"], "is a file, so nothing can"),
    ("ablate", ["--ablate_steps=1"], "name a benchmark: run.sh ablate <benchmark>"),
    ("sweep", ["resnet", "--coordinator_address=localhost:12355", "--num_processes=2",
               "--process_id=1"], "./run.sh sweep runs in one process (its state, tables"),
    ("ablate", ["resnet", "--num_processes=2", "--coordinator_address=localhost:12356",
                "--process_id=0"], "./run.sh ablate runs in one process"),
    ("ablate", ["resnet", "--num_cpu_devices=3", "--ablate_steps=0"],
     "ablate resnet: none of its 9 variants could run on this machine's devices (mesh"),
    ("scale", ["resnet", "--no_such_flag=1"], "Unknown command line flag 'no_such_flag'"),
    ("scale", ["resnet", "--chips=abc"], "--chips=abc: comma-separated integers"),
    ("scale", ["resnet", "--chips=17"], "--chips=17: the points of resnet are on 16, 64, 128"),
    ("scale", ["resnet", "--refresh=maybe"], "--refresh=maybe: expects true or false"),
    ("scale", ["resnet", "--overlap=partial"],
     "--overlap=partial: expects one of <schedule|none|full>"),
    ("scale", ["lm"], "scale lm: the points file has no lm point; choose one of resnet, ssd"),
    ("scale", [], "name a benchmark: run.sh scale <benchmark>"),
    ("scale", ["all", "--points={root}/missing.json"], "--points={root}/missing.json: no such"),
    ("scale", ["all", "--points={text_file}"], "--points={text_file}: not JSON (Expecting value"),
    ("scale", ["all", "--points={points_bert}"], "point p: unknown benchmark 'bert'"),
    ("scale", ["all", "--points={points_topology}"], "point p: --topology=v9:4x4: expected"),
    ("scale", ["all", "--points={points_batch}"],
     "point p: global_batch_size 100 is not divisible by the 32 ways its layout splits the batch"),
    ("scale", ["all", "--points={points_mesh}"],
     "point p: on v3:4x4 (TPU v3 slice 4x4: 16 chips, 32 devices (cores)): mesh"),
    ("scale", ["all", "--points={points_steps}"], "missing train_steps (a point needs"),
    ("scale", ["all", "--points={points_field}"], "point p: unknown config field(s) bogus"),
    ("scale", ["all", "--fit", "--fit_on=2048"], "--fit_on=2048: no chosen point has these"),
    ("scale", ["all", "--points={points_mesh_type}"], "point 1: 'mesh' is 5, expected a string"),
    ("scale", ["all", "--points={points_batch_type}"],
     "point p: config field global_batch_size: 'big' is not an integer"),
    ("scale", ["all", "--points={points_measured_type}"],
     "point 1: 'measured' is [1], expected a JSON object"),
    ("scale", ["all", "--points={points_source_type}"], "point 1: 'source' is 5, expected a list"),
    ("scale", ["all", "--points={points_facts_type}"],
     "point 1: 'facts' is 'x', expected a JSON object"),
    ("scale", ["all", "--points={points_width_type}"],
     "point p: config field model_width: 'wide' is not an integer"),
    ("scale", ["all", "--points={points_latin1}"], "not UTF-8 text (byte"),
    ("main", ["resnet", "--config=tiny", "--coordinator_address=auto"],
     "--coordinator_address=auto: jax found no cluster to join here"),
    ("main", ["resnet", "--output_dir=gs://bucket/runs"],
     "--output_dir=gs://bucket/runs: a gs:// URL, not a local path; meshperf writes through the "
     "file system, so mount the bucket"),
    ("sweep", ["resnet", "--output_dir=s3://bucket/sweep"], "--output_dir=s3://bucket/sweep: a "
     "s3:// URL"),
    ("scale", ["resnet", "--output_dir=gs://b/scale"], "--output_dir=gs://b/scale: a gs:// URL"),
    ("scale", ["ssd", "--chips=16", "--output_dir={text_file}"],
     "--output_dir={text_file} is a file"),
    ("scale", ["transformer", "--chips=16", "--plot={unwritable}/scale.png"],
     "--plot={unwritable}/scale.png: cannot write in"),
    ("main", ["resnet", "--base_learning_rate=0"], "--base_learning_rate=0.0: must be positive"),
    ("main", ["resnet", "--base_learning_rate=nan"], "--base_learning_rate=nan: give a finite"),
    ("main", ["resnet", "--end_learning_rate=-0.1"], "--end_learning_rate=-0.1: must be >= 0"),
    ("main", ["transformer", "--base_learning_rate=-1"],
     "--base_learning_rate=-1.0: must be positive"),
    ("main", ["ssd", "--base_learning_rate=0"], "--base_learning_rate=0.0: must be positive"),
    ("main", ["lm", "--base_learning_rate=0"], "--base_learning_rate=0.0: must be positive"),
    ("main", ["lm", "--end_learning_rate=1"], "--end_learning_rate=1.0 is above"),
    ("ablate", ["ssd", "--base_learning_rate=-0.5"], "--base_learning_rate=-0.5: must be positive"),
    ("sweep", ["resnet", "--optimizations_grid=turbo"],
     "--optimizations_grid: unknown optimization 'turbo'"),
    ("sweep", ["resnet", "--layouts=batch:data||batch:x"], "--layouts=batch:data||batch:x: item 2 "
                                                           "is empty; separate layouts with '|'"),
    ("sweep", ["resnet", "--layouts=batch:data|x:4,y:2@batch:x+"],
     "--layouts: item 2 'x:4,y:2@batch:x+'"),
    ("sweep", ["resnet", "--layouts=x:3@batch:x"], "mesh 'x:3' has 3 devices but 8 are available"),
    ("sweep", ["resnet", "--steps=-1"], "--steps=-1: timed steps per variant per round, >= 0"),
    ("sweep", ["resnet", "--to_target", "--num_runs=0"], "--num_runs=0: at least 1 run"),
    ("sweep", ["resnet", "--output_dir={other_sweep}"],
     "--output_dir={other_sweep} holds a sweep with other settings (depth: throughput there, "
     "compile here; steps: 7 there, 0 here"),
    ("main", ["resnet", "--num_cpu_devices=-1"], "--num_cpu_devices=-1: simulate N >= 1 CPU"),
    ("main", ["ssd", "--backbone_checkpoint={garbage_npz}"],
     "--backbone_checkpoint={garbage_npz}: not an .npz file (not a zip archive)"),
    ("main", ["ssd", "--backbone_checkpoint={folder}"], "no orbax checkpoint in {folder}"),
    ("main", ["ssd", "--backbone_checkpoint={resnet_block0_npz}"],
     "lacks params ['Block_1', 'Block_2', 'Block_3', 'Block_4', 'Block_5']: is it a ResNet-18"),
    ("main", ["ssd", "--backbone_checkpoint=/nonexistent.npz"], "/nonexistent.npz does not exist"),
    ("main", ["ssd", *SSD_COCO, "--data_dir={coco_cut_jpeg}"],
     "{val_jpeg} (id {val_id}) is cut short: a JPEG of"),
    ("main", ["ssd", *SSD_COCO, "--data_dir={coco_missing_jpeg}"],
     "{val_jpeg} (id {val_id}) is missing"),
    # --- more: values out of range, runs that cannot be laid out, inputs of the wrong kind -----
    ("main", ["resnet", "--seed=-1"], "--seed=-1: seeds are integers >= 0"),
    ("main", ["resnet", "--max_epochs=-3"], "--max_epochs must be positive (got -3)"),
    ("main", ["resnet", "--eval_epochs=0"], "--eval_epochs=0: epochs count from 1"),
    ("main", ["resnet", "--eval_every_samples=6400"],
     "--eval_every_samples: this benchmark evaluates after epochs"),
    ("main", ["lm", "--eval_epochs=2"], "--eval_epochs: this benchmark evaluates every"),
    ("main", ["lm", "--eval_every_samples=100"], "--eval_every_samples=100 is not a multiple of"),
    ("main", ["resnet", "--eval_batch_size=12"], "--eval_batch_size=12 is not divisible by the 8"),
    ("main", ["resnet", "--optimizations=grad_accum:3"], "x 3 micro-batches"),
    ("main", ["resnet", "--mesh=data:0"], "mesh axis 'data' has size 0"),
    ("main", ["resnet", "--layout=batch:data+data"], "names a mesh axis twice"),
    ("main", ["resnet", "--dtype=float16"], "--dtype=float16: choose float32 or bfloat16"),
    ("main", ["transformer", "--attention=flash"], "--attention=flash: choose one of xla, cudnn"),
    ("main", ["lm", "--dropout_rng=philox"], "--dropout_rng=philox: choose one of threefry, rbg"),
    ("main", ["transformer", "--softmax_dtype=bfloat16"],
     "--softmax_dtype=bfloat16: choose one of float32, compute"),
    ("main", ["transformer", "--softmax_dtype=compute", "--attention=cudnn", "--dtype=bfloat16",
              "--attention_dropout=0"], "--softmax_dtype=compute is jax's attention's"),
    ("main", ["resnet", "--state_layouts=tiled"], "--state_layouts=tiled: choose one of default"),
    ("main", ["lm", "--attention=cudnn", "--attention_dropout=0"],
     "--attention=cudnn runs cuDNN's fused kernel, in bfloat16 only"),
    ("main", ["transformer", "--attention=cudnn", "--dtype=bfloat16", "--attention_dropout=0.1"],
     "cuDNN's fused kernel has no dropout on the attention weights"),
    ("main", ["lm", "--attention=cudnn", "--dtype=bfloat16", "--attention_dropout=0"],
     "these devices are cpu: pass --attention=xla"),
    ("main", ["transformer", "--attention=cudnn", "--dtype=bfloat16", "--attention_dropout=0",
              "--compile_only", "--topology=v3:2x2"],
     "these devices are tpu: pass --attention=xla"),
    ("main", ["llama", "--attention=cudnn"], "--attention=cudnn runs cuDNN's fused kernel, in "
     "bfloat16 only"),
    ("main", ["llama", "--attention=cudnn", "--dtype=bfloat16"],
     "these devices are cpu: pass --attention=xla"),
    ("main", ["llama", "--attention=flash"], "--attention=flash: choose one of xla, cudnn"),
    ("main", ["resnet", "--division=bogus"], "--division=bogus: expects one of <open|closed>"),
    ("main", ["resnet", "--run_index=-1"], "--run_index=-1: must be >= 0"),
    ("main", ["resnet", "--momentum=1.5"], "--momentum=1.5: must be in [0, 1)"),
    ("main", ["resnet", "--num_classes=1"], "--num_classes=1: a classifier needs at least 2"),
    ("main", ["resnet", "--bn_span=3"], "--bn_span=3 does not divide the 64 examples"),
    ("main", ["resnet", "--config="], "--config=: write it as --config=NAME"),
    ("main", ["resnet", "--topology=v3:2x2"], "--topology names a slice to compile for"),
    ("main", ["resnet", "--compile_only", "--topology=v9:2x2"], "--topology=v9:2x2: expected"),
    ("main", ["ssd", "--image_size=0"], "--image_size=0: must be positive"),
    ("main", ["ssd", "--nms_iou=0"], "--nms_iou=0.0: an IoU in (0, 1]"),
    ("main", ["transformer", "--dataset=text", "--data_dir={root}/uneven", "--eval_split=train"],
     "train.en has 40 lines but train.de has 39"),
    ("main", ["lm", "--dataset=text", "--data_dir={root}/empty_lm"], "train.txt has no text"),
    # --- series and packages (a NOT A RESULT log: tests/test_package.py) ------------------------
    ("main", ["resnet", "--num_runs=0"], "--num_runs=0: at least 1 run"),
    ("main", ["resnet", "--num_runs=2", "--resume"],
     "--num_runs=2 with --resume: a resumed run is not an MLPerf result"),
    ("run.sh", ["package"], "name the run folders: ./run.sh package <run folder>"),
    ("run.sh", ["package", "{root}/missing"], "{root}/missing does not exist; pass run folders"),
    ("run.sh", ["package", "{root}/logs/empty"], "no result_*.txt in {root}/logs/empty"),
    ("run.sh", ["package", "{root}/logs/cut"], "its last line (line 3) is cut off mid-record"),
    ("run.sh", ["package", "{root}/logs/cut", "--rulset=1.0.0"], "unknown flag --rulset"),
    ("main", ["resnet", "--profile_steps=5:3"], "--profile_steps=5:3: B must be greater than A"),
    ("main", ["resnet", "--profile_steps=x"], "--profile_steps=x: write A:B"),
    ("main", ["resnet", "--profile_steps=-1:2"], "--profile_steps=-1:2: global steps count from 0"),
    ("main", ["resnet", "--profile_steps=0:100000"],
     "--profile_steps=0:100000: the run has 880 steps"),
    # --- runs that cannot mean anything, refused before run_start (issue: reliability) --------
    ("main", ["resnet", "--layout=bacth:data"], "layout rule 'bacth:data' names dimension "
     "'bacth', which resnet does not have; did you mean 'batch'?"),
    ("main", ["transformer", "--mesh=data:4,model:2", "--layout=batch:data;head:model"],
     "names dimension 'head', which transformer does not have; did you mean 'heads'?"),
    ("sweep", ["ssd", "--layouts=batch:data|hieght:data"],
     "names dimension 'hieght', which ssd does not have; did you mean 'height'?"),
    ("scale", ["all", "--points={points_dimension}"],
     "point p: layout rule 'bacth:x+y' names dimension 'bacth'"),
    ("main", ["lm", "--target_log_perplexity=nan"], "--target_log_perplexity=nan: give a finite"),
    ("main", ["llama", "--config=tiny", "--dataset=c4", "--data_dir={c4_float}"],
     "its tokens are float32 (dtype code 7), and token ids are integers"),
    ("main", ["llama", "--config=tiny", "--dataset=c4", "--data_dir={c4_big_id}"],
     "c4-train.en_6_text_document.bin: token 11,105 (document 37) is id 5000, outside the "
     "model's --vocab_size=1,024"),
    ("main", ["llama", "--config=tiny", "--rope_theta=1e-300"],
     "--rope_theta=1e-300: the rotary base must be above 1"),
    ("main", ["resnet", "--warmup_epochs=1e300"], "--warmup_epochs=1e+300: at most 100,000"),
    ("main", ["lm", "--warmup_steps=10000000000"], "--warmup_steps=10000000000: at most"),
    ("main", ["transformer", "--label_smoothing=inf"], "--label_smoothing=inf: give a finite"),
    ("main", ["resnet", "--num_classes=5"],
     "--num_classes=5: the digits dataset has 10 classes (labels 0..9); pass --num_classes=10"),
    ("main", ["resnet", "--dataset=imagenet", "--data_dir={imagenet}", "--num_classes=100",
              "--global_batch_size=8"], "--num_classes=100: imagenet2012 in {imagenet} has 1000"),
    ("main", ["resnet", "--dataset=synthetic", "--synthetic_examples=40"],
     "--dataset=synthetic: 40 examples an epoch (--synthetic_examples) are fewer than one batch "
     "(--global_batch_size=64)"),
    ("main", ["resnet", "--dataset=synthetic", "--eval_batch_size=1000000000"],
     "1,281,167 examples an epoch (--synthetic_examples) are fewer than one batch "
     "(--eval_batch_size=1000000000)"),
    ("main", ["resnet", "--seed=18446744073709551616"], "seeds are 32-bit, at most 4294967295"),
    ("main", ["resnet", "--num_runs=3", "--seed=4294967295"],
     "run i of the series takes seed --seed + i, up to 4294967297"),
    ("main", ["resnet", "--max_epochs=100000000000000"], "--max_epochs=100000000000000: at most"),
    ("main", ["resnet", "--num_runs=100000000000000"], "--num_runs=100000000000000: at most 1000"),
    # More memory than the host or a device has: refused before it is allocated.
    ("main", ["resnet", "--image_size=20000"],
     "--image_size=20000 with batches of 128 images per host needs 1,144.4 GiB of host memory"),
    ("main", ["resnet", "--image_size=5000", "--global_batch_size=8", "--eval_batch_size=8"],
     "--dataset=digits at --image_size=5000 (its 1,797 images are held resized) needs"),
    ("main", ["ssd", "--image_size=30000"], "--image_size=30000 with batches of"),
    ("main", ["resnet", "--model_width=2048"],
     "the compiled train step needs 122.12 GiB per device (arguments 60.95, temporaries"),
    # --- broken data, found before the expensive part ------------------------------------------
    ("main", ["ssd", *SSD_COCO, "--data_dir={coco_nan_box}"],
     "annotation {nan_annotation} (image"),
    ("main", ["ssd", *SSD_COCO, "--data_dir={coco_twice}"],
     "instances_val2017.json: image id {twice_id} is listed twice"),
    ("main", ["ssd", *SSD_COCO, "--data_dir={coco_missing_train}"],
     "training image {coco_missing_train}/train2017/{train_jpeg}"),
    ("main", ["transformer", "--dataset=text", "--data_dir={root}/latin1", "--eval_split=dev"],
     "train.de is not UTF-8 text: byte offset 10 (line 2) holds 0xfc"),
    ("main", ["transformer", "--dataset=text", "--data_dir={root}/en_folder"],
     "{root}/en_folder/train.en is a folder"),
    ("main", ["lm", "--dataset=text", "--data_dir={root}/latin1_lm"],
     "train.txt is not UTF-8 text: byte offset 2 (line 1) holds 0xfc"),
    # --- output paths that can never be written, found before compiling ------------------------
    ("main", ["resnet", "--output_dir={root}/dangling"],
     "{root}/dangling is a symbolic link to {root}/no-such-target, which does not exist"),
    ("main", ["resnet", "--output_dir={root}/loop_a/run"],
     "{root}/loop_a is a symbolic link in a loop of links"),
    ("main", ["resnet", "--output_dir={root}/" + "r" * 300], "is 300 bytes; the file system"),
    # --- reliability, third round: what a user has is never overwritten; nothing hangs; one line
    ("dryrun", ["resnet", "--config=tiny", "--output_dir={root}/finished_run"],
     "--output_dir={root}/finished_run holds summary.json, not a dry run's files"),
    ("dryrun", ["resnet", "--config=tiny", "--resume"],
     "--resume is a flag of a run that trains; a dry run trains nothing"),
    ("run.sh", ["check", "{root}/fifo.txt"],
     "{root}/fifo.txt is a FIFO (named pipe), not a regular file"),
    ("run.sh", ["check", "{root}/fifo_log"],
     "{root}/fifo_log/result_0.txt is a FIFO (named pipe), not a regular file"),
    ("run.sh", ["package", "{root}/fifo_summary_run"],
     "{root}/fifo_summary_run/summary.json is a FIFO (named pipe), not a regular file"),
    ("main", ["resnet", "--dataset=imagenet", "--data_dir={root}/two\nlines"],
     "--data_dir={root}/two\\nlines does not exist"),
    ("throughput", ["all", "--config=gpu-8xh100", "--steps=0"],
     "--steps=0: timed steps, at least 1"),
    ("sweep", ["resnet", "--layouts="], "--layouts= is blank"),
    ("main", ["resnet", "--compile_only", "--compile_cache={text_file}"],
     "--compile_cache={text_file} is a file; name a folder"),
]


def _tree(*roots, cache=None):
  """Every path under the roots (files and folders), but for finished tokenizers in the cache:
  a vocabulary trained before the run failed (a model that does not fit the layout) is kept
  for the next run, like any cached tokenizer; and the record of which XLA flags this jaxlib
  takes (`runtime.backend`'s probe, once per machine, written when the devices start)."""
  paths = {os.path.join(d, n) for r in roots if os.path.isdir(r) for d, ds, fs in os.walk(r)
           for n in ds + fs}
  kept = os.path.join(str(cache), "tokenizers")
  probe = os.path.join(str(cache), "xla-flags-taken.json")
  return {p for p in paths if not (p == kept or p.startswith(kept + os.sep)
                                   and p.endswith(".model") or p == probe)}


def _own_process(verb, args) -> bool:
  return verb not in IN_PROCESS or any(a.startswith(OWN_PROCESS_FLAGS) for a in args)


def _run(verb, args, cwd, cache, tmp):
  """(exit status, stderr) of the verb in a process of its own."""
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["MESHPERF_CACHE"] = cache
  env["TMPDIR"] = tmp
  env["PYTHONPATH"] = ROOT
  p = subprocess.run(VERBS[verb] + args, cwd=cwd, env=env, capture_output=True, text=True,
                     timeout=300, check=False)
  return p.returncode, p.stderr


def _run_here(verb, args, cwd, cache, tmp, monkeypatch, capfd):
  """(exit status, stderr) of the verb called in this process (`tests.helpers.run_here`)."""
  monkeypatch.chdir(cwd)
  monkeypatch.setenv("MESHPERF_CACHE", cache)
  monkeypatch.setattr(tempfile, "tempdir", tmp)
  code, _, err = helpers.run_here(IN_PROCESS[verb], args, capfd)
  return code, err


def _id(verb, args):
  text = " ".join(args)
  return f"{verb} {text if len(text) <= 72 else args[0] + ' ..' + text[-60:]}"


@pytest.mark.parametrize("verb,args,needle", CASES, ids=[_id(v, a) for v, a, _ in CASES])
def test_bad_input(inputs, tmp_path, monkeypatch, capfd, verb, args, needle):
  out = tmp_path / "out"
  cwd, cache, tmp = tmp_path / "cwd", tmp_path / "cache", tmp_path / "tmp"
  for folder in (cwd, cache, tmp):
    folder.mkdir()

  def fill(text):
    return text.format(**inputs, out=out)
  args = [fill(a) for a in args]
  if verb in ("main", "ablate", "sweep", "dryrun") or (verb == "run.sh" and args and args[0] in
                                    ("resnet", "transformer", "ssd", "lm")):
    if not any(a.startswith("--output_dir") for a in args):
      args.append(f"--output_dir={out}")
  before = _tree(tmp_path, inputs["root"], cache=cache)
  if _own_process(verb, args):
    code, stderr = _run(verb, args, str(cwd), str(cache), str(tmp))
  else:
    code, stderr = _run_here(verb, args, str(cwd), str(cache), str(tmp), monkeypatch, capfd)
  said = stderr[-3000:]
  assert code == 2, said
  assert "Traceback" not in stderr, said
  assert not any(line.lower().startswith(("usage", "flags:")) for line in stderr.splitlines())
  errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and fill(needle) in errors[0], said
  assert not out.exists()
  assert _tree(tmp_path, inputs["root"], cache=cache) == before   # nothing made or removed


def test_some_cases_run_in_their_own_process_and_most_here():
  """The split is what the code needs, not a way around a case: every verb with an in-process
  entry point has cases here, the shell and device counts in their own process."""
  own = [(v, a) for v, a, _ in CASES if _own_process(v, a)]
  assert {v for v, _ in own} >= {"run.sh", "main"}
  assert len(own) < len(CASES) / 3, len(own)
  assert {v for v, a, _ in CASES if not _own_process(v, a)} == set(IN_PROCESS)


# One case of each verb that runs in this process above, in a process of its own: the entry
# points' own `python -m` modules, `run_main` and the process's real exit status.
OWN_PROCESS_ONCE = [
    ("main", ["resnet", "--global_batch_size=abc"], "--global_batch_size=abc: expects an integer"),
    ("ablate", ["resnet", "--ablate_rounds=0"], "--ablate_rounds=0: at least 1"),
    ("sweep", ["resnet", "--steps=-1"], "--steps=-1: timed steps per variant per round, >= 0"),
    ("scale", ["resnet", "--chips=abc"], "--chips=abc: comma-separated integers"),
]


@pytest.mark.parametrize("verb,args,needle", OWN_PROCESS_ONCE,
                         ids=[v for v, _, _ in OWN_PROCESS_ONCE])
def test_bad_input_in_a_process_of_its_own(tmp_path, verb, args, needle):
  assert (verb, args, needle) in CASES and not _own_process(verb, args)
  out = tmp_path / "out"
  cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
  cwd.mkdir()
  tmp.mkdir()
  extra = [f"--output_dir={out}"] if verb != "scale" else []
  code, stderr = _run(verb, args + extra, str(cwd), str(tmp_path / "cache"), str(tmp))
  assert code == 2 and "Traceback" not in stderr, stderr[-3000:]
  errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and needle in errors[0], stderr[-3000:]
  assert not out.exists() and os.listdir(cwd) == [] and os.listdir(tmp) == []


def test_a_sweep_of_two_processes_is_refused_by_both(tmp_path):
  """`./run.sh sweep` started as two processes of one job: each refuses in one line, before
  any process waits for the other, and neither writes the sweep's folder."""
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["PYTHONPATH"] = ROOT
  out = tmp_path / "sweep"
  procs = [subprocess.Popen(VERBS["sweep"] + ["resnet", "--coordinator_address=localhost:12357",
                                              "--num_processes=2", f"--process_id={i}",
                                              f"--output_dir={out}"],
                            cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  for p in procs:
    _, err = p.communicate(timeout=120)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert p.returncode == 2 and len(errors) == 1, err[-2000:]
    assert "runs in one process" in errors[0] and "Traceback" not in err
  assert not out.exists()


# The environment a run starts in, wrong: each in a process of its own (jax reads it once).
ENV_CASES = [
    ({"JAX_PLATFORMS": "cuda"}, ["resnet", "--num_cpu_devices=0"],
     "JAX_PLATFORMS=cuda: jax cannot start that backend on this machine"),
    ({"XLA_FLAGS": "--xla_no_such_flag=1"}, ["resnet"],
     "XLA_FLAGS=--xla_no_such_flag=1: the XLA of jax"),
    ({"XLA_FLAGS": "xla_cpu_foo"}, ["resnet"], "XLA_FLAGS: 'xla_cpu_foo' is not an XLA flag"),
    ({"MESHPERF_CACHE": "{unwritable}/cache"}, ["resnet"],
     "MESHPERF_CACHE={unwritable}/cache: cannot write in"),
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=abc"}, ["resnet"],
     "XLA_FLAGS: --xla_force_host_platform_device_count=abc: give a number of simulated CPU"),
    pytest.param({"LIBTPU_INIT_ARGS": "--xla_tpu_no_such_flag=1"}, ["resnet"],
                 "LIBTPU_INIT_ARGS=--xla_tpu_no_such_flag=1: libtpu refused them",
                 marks=helpers.needs_libtpu),
]


@pytest.mark.parametrize("env,args,needle", ENV_CASES, ids=[
    next(iter(e)) + " " + " ".join(a) for e, a, _ in (getattr(c, "values", c) for c in ENV_CASES)])
def test_bad_environment(inputs, tmp_path, env, args, needle):
  """Bad input from the environment is bad input too: one line, status 2 (not XLA's abort with
  status 1, an epoch limit's, nor a traceback), nothing left behind."""
  out, cwd = tmp_path / "out", tmp_path / "cwd"
  cwd.mkdir()
  full = dict(os.environ, PYTHONPATH=ROOT, MESHPERF_CACHE=str(tmp_path / "cache"))
  full.pop("XLA_FLAGS", None)
  full.update({k: v.format(**inputs) for k, v in env.items()})
  p = subprocess.run(VERBS["main"] + args + [f"--output_dir={out}"], cwd=str(cwd), env=full,
                     capture_output=True, text=True, timeout=300, check=False)
  errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
  assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
  assert len(errors) == 1 and needle.format(**inputs) in errors[0], p.stderr[-3000:]
  assert not out.exists() and os.listdir(cwd) == []


def test_a_second_run_on_the_same_output_folder_refuses(tmp_path, monkeypatch):
  """While a run holds its --output_dir (here this process holds the lock the run would), a
  second run there refuses in one line before it compiles; the lock goes with its holder."""
  from harness import outputs
  cache, out, cwd = tmp_path / "cache", tmp_path / "out", tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.setenv("MESHPERF_CACHE", str(cache))
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)
  with outputs.output_lock(str(out)):
    with pytest.raises(UserError, match="another run"):       # the kernel's lock, per open file
      with outputs.output_lock(str(out) + "/"):
        pass
    p = subprocess.run(VERBS["main"] + ["resnet", f"--output_dir={out}"], cwd=str(cwd), env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert errors == [f"error: --output_dir={out}: another run (process {os.getpid()}) is "
                      f"writing there; wait for it to end, or choose another --output_dir"]
    assert "compiled in" not in p.stdout and not out.exists()
  assert not (cache / "locks").exists()          # released: the file and its folder removed
  with outputs.output_lock(str(out)):             # and free again
    pass
