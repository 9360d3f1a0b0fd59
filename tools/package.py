"""`./run.sh package <run folders...> [--org=NAME] [--system=NAME] [--output_dir=DIR]
[--division=open|closed] [--ruleset=X.Y.Z]`: an MLPerf training submission package of one
benchmark's runs, checked with mlperf_logging's own checkers, and its score.

The layout is the submission rules' "Directory structure" for training
(https://github.com/mlcommons/policies/blob/master/submission_rules.adoc):

  <output_dir>/<org>/systems/<system>.json                        what system_desc_checker requires
  <output_dir>/<org>/results/<system>/<benchmark>/result_<i>.txt  the logs, numbered by run_start
  <output_dir>/<org>/benchmarks/<benchmark>/implementations/meshperf/   the code, its git commit
  <output_dir>/<org>/benchmarks/<benchmark>/implementations/<system>/   how to set up and run
  <output_dir>/checks/     the checkers' own logs and result_summarizer's table
  <output_dir>/package.json   which log became which result, each check's verdict, the scores

Then `mlperf_logging.package_checker` (compliance of every log, the result count, the system
description from ruleset 1.0.0, seeds and RCPs in the closed division), `rcp_checker` where the
ruleset has reference convergence points for the benchmark and the division is closed, and
`result_summarizer`; each check's verdict is printed (pass, fail with its first error line, or
why it does not apply) and the score: the olympic mean of minutes to train, computed here from
the logs (`logs.results`) beside result_summarizer's. Exit status 0 when every check that
applies passed, 1 when one failed, 2 on bad input (nothing is written then).
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

from absl import flags

from benchmarks import config as config_lib
from benchmarks import registry
from logs import compliance, rcp, resumed
from logs import results as res
from runtime import files, scratch
from runtime.errors import UserError
from tools import check as check_cli

FV = flags.FlagValues()
flags.DEFINE_string("org", None, "Submitting organization (default: the logs' submission_org).",
                    flag_values=FV)
flags.DEFINE_string("system", None, "System name, <system>.json (default: the logs' "
                    "submission_platform, e.g. 8xcpu).", flag_values=FV)
flags.DEFINE_string("output_dir", None, "Where the package goes (default runs/package/<time>).",
                    flag_values=FV)
flags.DEFINE_string("division", None, "open or closed (default: the logs'; must agree with them).",
                    flag_values=FV)
flags.DEFINE_string("ruleset", None, "MLPerf training ruleset (default: the newest of the "
                    "benchmark's that the installed checkers know).", flag_values=FV)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The project's packages: what a run imports, and the tools run.sh calls.
CODE = ("benchmarks", "harness", "logs", "mesh", "optimizations", "runtime", "stepmodel", "tools")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclasses.dataclass(frozen=True)
class Run:
  log: str                 # the run's result_<i>.txt
  summary: dict            # its summary.json / summary_<i>.json
  time: res.RunTime
  logged: dict             # submission_* values of the log


def _logged(records: list[dict]) -> dict:
  keys = ("submission_benchmark", "submission_org", "submission_division", "submission_status",
          "submission_platform")
  return {k.split("_", 1)[1]: next((r["value"] for r in records if r["key"] == k), None)
          for k in keys}


# What the package reads of a summary.json, and the type of each.
SUMMARY_FIELDS = {"benchmark": str, "mlperf_benchmark": str, "config": dict, "devices": int,
                  "platform": str, "processes": int, "jax_version": str}


def _check_summary(summary, path: str, log: str, logged_benchmark: str | None) -> None:
  """The summary is a run's summary.json, of the same run as the log beside it: a dict with the
  fields the package reads, of their types, and the benchmark the log names."""
  bad = ([] if not isinstance(summary, dict) else
         [k for k, t in SUMMARY_FIELDS.items() if not isinstance(summary.get(k), t)])
  batch = summary["config"].get("global_batch_size") if isinstance(summary, dict) and not bad \
      else None
  if isinstance(summary, dict) and not bad and not (isinstance(batch, int) and batch > 0):
    bad = ["config.global_batch_size"]     # the RCP check reads it
  if not isinstance(summary, dict) or bad:
    what = (f"lacks {', '.join(bad)} or has them of another type" if bad else
            f"is a JSON {type(summary).__name__}, not an object")
    raise UserError(f"{path} is not the summary.json of a meshperf run (it {what}); put the run's "
                    f"own summary beside {os.path.basename(log)}, or run it again")
  if logged_benchmark is not None and summary["mlperf_benchmark"] != logged_benchmark:
    raise UserError(f"{path} is the summary of a {summary['mlperf_benchmark']} run, but "
                    f"{os.path.basename(log)} logs {logged_benchmark}; put the run's own summary "
                    f"beside its log")


def gather(folders: list[str]) -> list[Run]:
  """The runs in the folders, ordered by run_start. Bad input (UserError): a missing folder, a
  folder without result logs, a log that is cut off or NOT A RESULT (interrupted or resumed:
  `logs.resumed`), a log without its summary, logs of another benchmark, division or platform."""
  runs, seen_folders = [], set()
  for folder in folders:
    if os.path.realpath(folder) in seen_folders:
      raise UserError(f"{folder} is named twice; name each run folder once")
    seen_folders.add(os.path.realpath(folder))
    if not os.path.isdir(folder):
      what = "is not a folder" if os.path.exists(folder) else "does not exist"
      raise UserError(f"{folder} {what}; pass run folders (a run's --output_dir)")
    logs = sorted(glob.glob(os.path.join(folder, "result_*.txt")))
    if not logs:
      raise UserError(f"no result_*.txt in {folder}; pass a run's --output_dir")
    for log in logs:
      records = compliance.read_log(log)
      why = resumed.verdict(log)
      if why:
        raise UserError(f"{log} is NOT A RESULT: {why}; a package holds only whole runs: move it "
                        f"out of {folder} or run it again")
      m = re.fullmatch(r"result_(\d+)\.txt", os.path.basename(log))
      name = "summary.json" if m and int(m.group(1)) == 0 else f"summary_{m and m.group(1)}.json"
      path = os.path.join(folder, name)
      files.check_regular(path)
      try:
        with open(path, encoding="utf-8") as f:
          summary = json.load(f)
      except (OSError, ValueError):
        raise UserError(f"{log}: no readable {name} beside it (a run writes both); pass the "
                        f"run's whole --output_dir") from None
      logged = _logged(records)
      _check_summary(summary, path, log, logged["benchmark"])
      runs.append(Run(log, summary, res.run_time(log, records), logged))
  for key in ("benchmark", "division", "platform"):
    seen = {}
    for r in runs:
      seen.setdefault(r.logged[key], r.log)
    if len(seen) > 1:
      (a, pa), (b, pb) = list(seen.items())[:2]
      hint = {"benchmark": "package one benchmark at a time",
              "division": "package each division on its own",
              "platform": "runs of another system go under their own --system, in a package "
                          "of their own"}[key]
      raise UserError(f"the logs mix submission_{key} {a!r} ({pa}) and {b!r} ({pb}); {hint}")
  return sorted(runs, key=lambda r: r.time.run_start_ms)


def choose_ruleset(mlperf_name: str, given: str | None) -> str:
  """--ruleset, or the newest of the benchmark's rulesets (its Spec) that the package checker
  knows the benchmark in (mlperf_logging.benchmark_meta: it skips an unknown benchmark without
  checking it, so a package of one would pass unchecked)."""
  from mlperf_logging.benchmark_meta import get_allowed_benchmarks
  from mlperf_logging.compliance_checker.mlp_compliance import rule_choices
  known = {r for r in rule_choices() if _knows(get_allowed_benchmarks, r, mlperf_name)}
  mine = [r for r in check_cli.rulesets_of(mlperf_name) if r in known]
  order = lambda r: tuple(int(x) for x in r.split("."))  # noqa: E731
  if given is None:
    if not mine:
      raise UserError(f"the installed mlperf_logging knows {mlperf_name} in no ruleset meshperf's "
                      f"logs follow ({', '.join(check_cli.rulesets_of(mlperf_name))})")
    return max(mine, key=order)
  if given not in rule_choices():
    raise UserError(f"--ruleset={given}: mlperf_logging has no training ruleset {given}; "
                    f"{mlperf_name} logs check under {', '.join(sorted(mine, key=order))}")
  if given not in known:
    raise UserError(f"--ruleset={given}: ruleset {given} has no benchmark {mlperf_name} (the "
                    f"package checker would skip it unchecked); choose one of "
                    f"{', '.join(sorted(known, key=order))}")
  return given


def _knows(allowed, ruleset: str, name: str) -> bool:
  try:
    return name in allowed("training", ruleset)
  except ValueError:
    return False


def _check_args(argv: list[str]) -> tuple[list[str], dict]:
  try:
    rest = FV(["package"] + argv)[1:]
  except flags.Error as e:
    text = str(e).strip().splitlines()[0]
    if isinstance(e, flags.UnrecognizedFlagError):
      text = f"unknown flag --{e.flagname}"
    raise UserError(f"{text}; ./run.sh package --help lists the flags") from None
  if not rest:
    raise UserError("name the run folders: ./run.sh package <run folder> [...] [--org=NAME] "
                    "[--system=NAME] (a folder is a run's --output_dir)")
  if FV.division not in (None, "open", "closed"):
    raise UserError(f"--division={FV.division}: choose open or closed")
  for flag in ("org", "system"):
    if FV[flag].value is not None and not _NAME.fullmatch(FV[flag].value):
      raise UserError(f"--{flag}={FV[flag].value}: a folder name of letters, digits, '.', '_' "
                      f"and '-'")
  return rest, {n: FV[n].value for n in ("org", "system", "output_dir", "division", "ruleset")}


def plan(argv: list[str]) -> dict:
  """Everything checked and decided before anything is written (bad input raises UserError)."""
  folders, a = _check_args(argv)
  runs = gather(folders)
  first = runs[0].logged
  division = first["division"]
  if a["division"] and a["division"] != division:
    raise UserError(f"--division={a['division']}: the logs say {division} "
                    f"(submission_division); a package cannot change it")
  orgs = sorted({r.logged["org"] for r in runs})
  org = a["org"] or (orgs[0] if len(orgs) == 1 else None)
  if org is None:
    raise UserError(f"the logs name several submission_org ({', '.join(orgs)}); pass --org=NAME")
  system = a["system"] or re.sub(r"[^A-Za-z0-9._-]", "_", first["platform"] or "system")
  if not _NAME.fullmatch(org):
    raise UserError(f"submission_org {org!r} is no folder name; pass --org=NAME")
  ruleset = choose_ruleset(first["benchmark"], a["ruleset"])
  out = a["output_dir"] or os.path.join(
      "runs", "package", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
  if os.path.isdir(out) and os.listdir(out):
    raise UserError(f"--output_dir={out} already holds files; name a new or empty folder")
  config_lib.check_writable("--output_dir", out)
  return {"runs": runs, "org": org, "system": system, "division": division, "ruleset": ruleset,
          "benchmark": first["benchmark"], "status": first["status"], "out": out,
          "org_note": None if orgs == [org] else ", ".join(orgs)}


# --- writing the package ----------------------------------------------------------------------

def _git(*args) -> str:
  try:
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ""


def write_code(dest: str) -> str:
  """The meshperf code a run imports, and run.sh, pyproject.toml, README.md, LICENSE, into `dest`,
  with SOURCE.txt naming the git commit (and files that differ from it). MLPerf asks for the code
  of a submission (submission rules, "Source code requirements for replication")."""
  for top in CODE:
    shutil.copytree(os.path.join(ROOT, top), os.path.join(dest, top),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
  for name in ("run.sh", "pyproject.toml", "README.md", "LICENSE"):
    if os.path.exists(os.path.join(ROOT, name)):
      shutil.copy2(os.path.join(ROOT, name), dest)
  commit = _git("rev-parse", "HEAD")
  changed = [s[3:] for s in _git("status", "--porcelain", "--", *CODE, "run.sh",
                                 "pyproject.toml").splitlines() if s.strip()]
  what = (f"git commit {commit}" if commit else "not a git checkout: no commit") + (
      f", with uncommitted changes in {len(changed)} file(s)" if changed else "")
  with open(os.path.join(dest, "SOURCE.txt"), "w", encoding="utf-8") as f:
    f.write(f"meshperf, copied from {ROOT}\n{what}\n" + "".join(f"  {c}\n" for c in changed))
  return what


def _flag(value) -> str:
  if isinstance(value, list):
    if value and isinstance(value[0], list):
      return ";".join(",".join(map(str, g)) for g in value)
    return ",".join(map(str, value))
  return str(value).lower() if isinstance(value, bool) else str(value)


def command(run: Run, index: int) -> str:
  """The command line that repeats a run: every config field of its summary as a flag."""
  s = run.summary
  parts = ["./run.sh", s["benchmark"]] + [f"--{k}={_flag(v)}" for k, v in s["config"].items()]
  parts += [f"--run_index={index}", f"--division={run.logged['division']}",
            f"--submission_org={run.logged['org']}",
            f"--submission_status={run.logged['status']}", '--output_dir="$OUT"']
  return " ".join(p if p.endswith('"$OUT"') else shlex.quote(p) for p in parts)


def write_implementation(d: str, p: dict, code_what: str) -> None:
  """implementations/<system>/: the system-implementation JSON, README.md, setup.sh,
  init_datasets.sh and run_and_time.sh (submission rules, "Directory structure")."""
  runs, system, bench = p["runs"], p["system"], p["benchmark"]
  cfg = runs[0].summary["config"]
  os.makedirs(d)
  info = {"implementation": "meshperf", "code": code_what, "benchmark": bench,
          "meshperf_benchmark": runs[0].summary["benchmark"], "devices": runs[0].summary["devices"],
          "platform": runs[0].summary["platform"], "mesh": runs[0].summary.get("mesh"),
          "layout": runs[0].summary.get("layout"),
          "optimizations": runs[0].summary.get("optimizations"), "config": cfg}
  with open(os.path.join(d, f"{system}_meshperf.json"), "w", encoding="utf-8") as f:
    json.dump(info, f, indent=2)
  script = {
      "setup.sh": "# One-time setup: run.sh makes .venv and installs the pinned dependencies.\n"
                  f"cd \"$(dirname \"$0\")/../meshperf\" && ./run.sh {runs[0].summary['benchmark']}"
                  " --help > /dev/null\n",
      "init_datasets.sh": f"# The runs read dataset={cfg.get('dataset')!r}, data_dir="
                          f"{cfg.get('data_dir') or '(none: built in or made on first use)'!r}.\n"
                          + (f"test -e {shlex.quote(cfg['data_dir'])}\n" if cfg.get("data_dir")
                             else "true\n"),
      "run_and_time.sh": "# Each packaged result, repeated (result_<i>.txt in $OUT).\n"
                         "OUT=\"${1:-runs/rerun}\"\ncd \"$(dirname \"$0\")/../meshperf\"\n"
                         + "".join(f"{command(r, i)}\n" for i, r in enumerate(runs)),
  }
  for name, body in script.items():
    with open(os.path.join(d, name), "w", encoding="utf-8") as f:
      f.write("#!/usr/bin/env bash\nset -euo pipefail\n" + body)
    os.chmod(os.path.join(d, name), 0o755)
  with open(os.path.join(d, "README.md"), "w", encoding="utf-8") as f:
    f.write(f"# meshperf {bench} on {system}\n\nsetup.sh once, init_datasets.sh, then "
            f"run_and_time.sh [OUT]: it runs each packaged result again with the config and seed "
            f"of its summary. Code: ../meshperf ({code_what}).\n")


def write(p: dict) -> dict:
  """Writes the package; returns what it wrote (for the report)."""
  org_dir = os.path.join(p["out"], p["org"])
  bench, system, runs = p["benchmark"], p["system"], p["runs"]
  results_dir = os.path.join(org_dir, "results", system, bench)
  os.makedirs(results_dir)
  os.makedirs(os.path.join(p["out"], "checks"))
  legacy = p["ruleset"] in compliance.LEGACY_SYNTAX
  for i, r in enumerate(runs):
    target = os.path.join(results_dir, f"result_{i}.txt")
    if legacy:       # the 0.6 checkers read only the `:::MLL` syntax of MLPerf 0.6 logs
      with open(r.log, encoding="utf-8") as f, open(target, "w", encoding="utf-8") as g:
        g.writelines(compliance.to_mll_v06(f))
    else:
      shutil.copyfile(r.log, target)
  impl = os.path.join(org_dir, "benchmarks", bench, "implementations")
  code_what = write_code(os.path.join(impl, "meshperf"))
  write_implementation(os.path.join(impl, system), p, code_what)
  s0 = runs[0].summary
  notes = (f"{s0['devices']} {s0['platform']} device(s) in {s0['processes']} process(es)"
           + (" (simulated XLA CPU devices sharing the host's cores)"
              if s0["platform"] == "cpu" else "")
           + "; host fields read on the machine that made the package")
  desc, unknown = res.system_description(
      p["org"], system, p["division"], p["status"], s0["platform"],
      runs[0].logged["platform"] or "", s0["devices"], s0["processes"], s0["jax_version"],
      p["out"], notes, f"meshperf ({code_what})")
  os.makedirs(os.path.join(org_dir, "systems"))
  with open(os.path.join(org_dir, "systems", f"{system}.json"), "w", encoding="utf-8") as f:
    json.dump(desc, f, indent=2)
  return {"org_dir": org_dir, "results_dir": results_dir, "code": code_what, "unknown": unknown,
          "legacy_syntax": legacy}


# --- the checks and the score -----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Verdict:
  check: str
  state: str               # "pass", "fail" or "n/a" (does not apply)
  detail: str


def _tool(module: str, args: list[str], cwd: str) -> str:
  """Runs an mlperf_logging tool (a fresh process: they keep global logging state); its output."""
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True,
                        text=True, check=False)
  return f"{proc.stdout}\n{proc.stderr}\nexit status {proc.returncode}"


def _first(text: str, *marks: str) -> str:
  line = next((t for t in text.splitlines() if any(m in t for m in marks)), "")
  return re.sub(r"\s+", " ", line).strip()[:300]


def _order(ruleset: str) -> tuple[int, ...]:
  return tuple(int(x) for x in ruleset.split("."))


def check(p: dict, w: dict) -> list[Verdict]:
  """mlperf_logging's package_checker (with the system-description and seed checks it holds),
  rcp_checker and result_summarizer over the package; returns their verdicts, and puts
  result_summarizer's score in w["summarizer_score"]."""
  checks, org_dir = os.path.join(p["out"], "checks"), os.path.abspath(w["org_dir"])
  ruleset, bench, closed = p["ruleset"], p["benchmark"], p["division"] == "closed"
  text = _tool("mlperf_logging.package_checker",
               [org_dir, "training", ruleset, "--log_output", "package_checker.log"], checks)
  ok = "PACKAGE CHECKER FOUND NO ERRORS" in text
  why = _first(text, "ERROR") or _first(text, "Traceback", "Error")
  if "Failed checks" in text:
    why += f"; a log failed a compliance check: {_first(text, 'Failed checks')}"
  out = [Verdict("package_checker", "pass" if ok else "fail",
                 f"ruleset {ruleset}: {len(p['runs'])} result file(s) compliant, count and "
                 f"layout as the ruleset asks" if ok else why)]
  v1 = _order(ruleset) >= (1, 0, 0)     # package_checker: systems, seeds and RCPs from 1.0.0 on
  if not v1:
    out.append(Verdict("system description", "n/a", f"package_checker checks <system>.json from "
                       f"ruleset 1.0.0 on (this is {ruleset}); written anyway"))
  else:
    good = "System description checker passed" in text
    out.append(Verdict("system description", "pass" if good else "fail",
                       f"systems/{p['system']}.json has every field system_desc_checker requires"
                       if good else _first(text, "System description checker failed")))
  seeds = [r.time.seed for r in p["runs"]]
  repeat = f"; note: seeds repeat ({seeds})" if len(set(seeds)) < len(seeds) else ""
  if not (closed and v1):
    why = "open division" if not closed else f"ruleset {ruleset}"
    out.append(Verdict("seed check", "n/a", f"{why}: package_checker checks that runs log "
                       f"different seeds only for the closed division from ruleset 1.0.0 on"
                       + repeat))
  else:
    bad = "Seed checker failed" in text
    out.append(Verdict("seed check", "fail" if bad else "pass",
                       _first(text, "Seed checker failed") if bad else f"seeds {seeds}"))
  out.append(_rcp(p, w, checks, closed))
  out.append(_summarize(p, w, checks, org_dir, bench))
  return out


def _rcp(p, w, checks, closed) -> Verdict:
  from mlperf_logging.rcp_checker import rcp_checker
  ruleset, bench = p["ruleset"], p["benchmark"]
  if not closed:
    return Verdict("rcp_checker", "n/a", "open division: MLPerf holds convergence to the "
                   "reference convergence points in the closed division only (the open division "
                   "may change model and training method: training rules, 'Divisions'; "
                   "package_checker runs rcp_checker only for a closed system)")
  rcps = os.path.join(os.path.dirname(rcp_checker.__file__), f"training_{ruleset}",
                      f"rcps_{bench}.json")
  if not os.path.exists(rcps):
    return Verdict("rcp_checker", "n/a", f"ruleset {ruleset} has no reference convergence "
                   f"points for {bench}" + (" (RCPs start with ruleset 1.0.0)"
                                            if _order(ruleset) < (1, 0, 0) else ""))
  text = _tool("mlperf_logging.rcp_checker",
               [os.path.abspath(w["results_dir"]), "--rcp_usage", "training", "--rcp_version",
                ruleset, "--log_output", "rcp_checker.log"], checks)
  ok = text.rstrip().endswith("exit status 0")
  said = _first(text, "RCP test PASSED") if ok else _first(text, "ERROR", "Error")
  return Verdict("rcp_checker", "pass" if ok else "fail", f"{said}; {_rcp_case(p, bench)}")


def _rcp_case(p, bench) -> str:
  """What the checker held the series' global batch to (`logs.rcp`), and the series' mean."""
  batch = p["runs"][0].summary["config"]["global_batch_size"]
  entry = registry.by_mlperf_name(bench)
  unit = entry.spec.cadence if entry else "epochs"
  found = rcp.lookup(p["ruleset"], bench, batch, unit)
  return found.explain() if found else f"no RCPs for {bench} in {p['ruleset']}"


def _summarize(p, w, checks, org_dir, bench) -> Verdict:
  text = _tool("mlperf_logging.result_summarizer",
               [org_dir, "training", p["ruleset"], "--csv", "result_summary.csv"], checks)
  w["summarizer_score"] = None
  try:
    with open(os.path.join(checks, "result_summary.json"), encoding="utf-8") as f:
      w["summarizer_score"] = json.load(f)[0].get(bench)
  except (OSError, ValueError, IndexError, AttributeError):
    pass
  trouble = _first(text, "ERROR", "NOTICE", " in /", "Traceback")
  with open(os.path.join(checks, "result_summarizer.out"), "w", encoding="utf-8") as f:
    f.write(text)
  score = w["summarizer_score"]
  if score is None:
    return Verdict("result_summarizer", "fail", trouble or "no score for " + bench)
  return Verdict("result_summarizer", "fail" if trouble else "pass",
                 trouble or f"score {score:.4f} min")


def report(p: dict, w: dict, verdicts: list[Verdict]) -> int:
  """Prints the package, the verdicts and the score; writes package.json; the exit status."""
  runs, bench = p["runs"], p["benchmark"]
  print(f"package {w['org_dir']}: {bench}, ruleset {p['ruleset']}, {p['division']} division, "
        f"system {p['system']}, {len(runs)} run(s)")
  rel = os.path.relpath(w["results_dir"], w["org_dir"])
  for i, r in enumerate(runs):
    print(f"  {rel}/result_{i}.txt <- {r.log}  (seed {r.time.seed}, "
          f"{'success' if r.time.converged else 'did not reach the target'}, "
          f"{res.minutes_str(r.time.minutes)})")
  if w["legacy_syntax"]:
    print(f"  (result files in the MLPerf 0.6 ':::MLL' syntax, which ruleset {p['ruleset']} "
          f"reads; the run folders keep theirs)")
  if w["unknown"]:
    print(f"  systems/{p['system']}.json: {len(w['unknown'])} field(s) nothing on this machine "
          f"says are \"{res.UNKNOWN}\": {', '.join(w['unknown'])} (system_desc_checker asks only "
          f"that they are there: fill them in before submitting)")
  print(f"  benchmarks/{bench}/implementations/meshperf: the code ({w['code']})")
  if p["org_note"]:
    print(f"  note: the logs say submission_org {p['org_note']}, the package {p['org']}: rerun "
          f"with --submission_org={p['org']} to make them agree")
  print("checks:")
  for v in verdicts:
    print(f"  {v.check:<19} {v.state.upper():<5} {v.detail}")
  need = res.required_runs(bench)
  mine, why = res.olympic_mean([r.time for r in runs])
  failed = any(v.state == "fail" for v in verdicts)
  if mine is None:
    print(f"score: none: {why}")
  else:
    print(f"score: {res.minutes_str(mine)}: olympic mean of {len(runs)} runs' minutes from "
          f"run_start to run_stop (fastest and slowest dropped; MLPerf training rules, "
          f"'Benchmark Results')")
  theirs = w.get("summarizer_score")
  if theirs is not None:
    same = mine is not None and abs(theirs - mine) <= 1e-9 * max(1.0, mine)
    # The same score within 1e-9 is shown as ours: the two sums of floats may differ in their
    # last digits and round to different fourth decimals (0.0099 and 0.0100).
    print(f"  result_summarizer's score: {(mine if same else theirs):.4f} min"
          + (" (the same)" if same else " (differs: it counts the time of a run that ended "
             "with run_stop aborted, which MLPerf's rule counts as not converged)"
             if any(not r.time.converged for r in runs) else " (differs)"))
  official = []
  if need is not None and len(runs) != need:
    official.append(f"{len(runs)} run(s), MLPerf asks {need} for {bench}")
  if failed:
    official.append("a check failed")
  if official:
    print(f"  NOT AN OFFICIAL SCORE: {'; '.join(official)}")
  if p["division"] == "open":
    print(f"  an open-division result: MLPerf names it '{bench} Open' and compares it with no "
          f"closed-division result (training rules, 'Divisions')")
  with open(os.path.join(p["out"], "package.json"), "w", encoding="utf-8") as f:
    json.dump({"org": p["org"], "system": p["system"], "benchmark": bench,
               "ruleset": p["ruleset"], "division": p["division"],
               "results": {f"result_{i}.txt": r.log for i, r in enumerate(runs)},
               "minutes": [r.time.minutes for r in runs],
               "converged": [r.time.converged for r in runs], "required_runs": need,
               "score_minutes": mine, "no_score_because": why or None,
               "summarizer_score_minutes": theirs, "official": not official,
               "unknown_system_fields": w["unknown"], "code": w["code"],
               "checks": [dataclasses.asdict(v) for v in verdicts]}, f, indent=2)
  return 1 if failed else 0


HELP = __doc__.split("\n\n")[0]


def main(argv: list[str]) -> int:
  if any(a in ("-h", "--help", "--helpshort", "--helpfull") for a in argv):
    print(HELP + "\n\nflags:")
    for name in ("org", "system", "output_dir", "division", "ruleset"):
      print(f"  --{name}: {FV[name].help}")
    return 0
  p = plan(argv)
  return report(p, *_write_whole(p))


def _write_whole(p: dict) -> tuple[dict, list[Verdict]]:
  """Writes the package into a temporary folder beside --output_dir and renames it there only
  when it is whole, so a failure or a signal never leaves a half-written package; then checks
  it where it lies."""
  final = os.path.abspath(p["out"])
  parent = os.path.dirname(final)
  os.makedirs(parent, exist_ok=True)
  tmp = scratch.make(f".{os.path.basename(final)}.partial-", parent)
  try:
    w = write({**p, "out": tmp})
    if os.path.isdir(final):
      os.rmdir(final)              # empty (`plan` checked); rename takes its place
    os.rename(tmp, final)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  w = {k: v.replace(tmp, final, 1) if isinstance(v, str) and v.startswith(tmp) else v
       for k, v in w.items()}
  return w, check(p, w)


def run_main(argv: list[str]) -> None:
  """Bad input: one `error:` line and status 2 (runtime.errors); else main's status."""
  try:
    code = main(argv)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    code = 2
  sys.stdout.flush()
  sys.exit(code)


if __name__ == "__main__":
  run_main(sys.argv[1:])
