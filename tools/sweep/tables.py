"""A sweep's rows (`tools.sweep.measure`) as `sweep.csv` (every figure a column, one row per
variant, or per variant and seed when trained to the target) and as Markdown tables: here
(`local_table`, which `./run.sh ablate` prints too), at pod scale (`pod_table`) and to the
target (`target_table`)."""

from __future__ import annotations

import csv
import statistics

from stepmodel.cost import KINDS

IDENTITY = ("variant", "label", "group", "mesh", "layout", "optimizations", "baseline", "status",
            "reason", "resumed", "seed_index", "seed")
FIGURES = (("compile_s",)
           + tuple(f"{k.replace('-', '_')}_{w}" for k in KINDS for w in ("bytes", "count"))
           + ("memory_bytes", "argument_bytes", "temp_bytes", "opt_state_bytes", "timed_steps",
              "step_ms", "step_ms_q1", "step_ms_q3", "baseline_step_ms", "examples_per_s",
              "examples_per_s_per_device", "tokens_per_s_per_device",
              "model_tflops_per_s_per_device", "mfu", "eval_ms", "step_ratio", "step_ratio_q1",
              "step_ratio_q3", "eval_ratio", "fits", "refused", "model_step_ms", "collective_ms",
              "xla_ms", "eval_model_ms", "predicted_minutes", "ending", "exit_status",
              "time_to_train_s", "epochs", "final_quality", "result"))
RESUMED_MARK = "†"


def write_csv(rows: list[dict], path: str) -> None:
  present = {k for r in rows for k, v in r.items() if v is not None}
  cols = [c for c in IDENTITY + FIGURES if c in present]
  cols += sorted(present - set(cols))
  with open(path, "w", newline="", encoding="utf-8") as f:
    w = csv.DictWriter(f, cols, extrasaction="ignore")
    w.writeheader()
    for r in rows:
      w.writerow({k: ("" if r.get(k) is None else r[k]) for k in cols})


def _kinds(rows) -> list[str]:
  """Collective kinds any done row has (all-reduce always)."""
  return [k for k in KINDS if k == "all-reduce" or any(
      r.get(f"{k.replace('-', '_')}_count") for r in rows if r["status"] == "done")]


def _kib(n) -> str:
  return "-" if n is None else f"{n / 1024:,.0f}"


def _mib(n) -> str:
  return f"{n / 2**20:,.0f}"


def _sec(x) -> str:
  return "-" if x is None else f"{x:,.1f}"


def _label(r) -> str:
  return r["label"] + (f" {RESUMED_MARK}" if r.get("resumed") else "")


def _ratio(x, ratio) -> str:
  return "-" if x is None else f"{x:,.1f}" + ("" if ratio is None else f" ({ratio:.2f})")


def local_table(rows: list[dict]) -> str:
  """Compiled here: collectives per step, memory per device and (when timed) step and eval ms
  with their ratios to the baseline, examples/s. Bytes in KiB."""
  kinds, timed = _kinds(rows), any(r.get("step_ms") is not None for r in rows)
  layouts = len({r["layout"] for r in rows}) > 1
  head = (["variant", "mesh"] + (["layout"] if layouts else [])
          + [f"{k} KiB (n)" for k in kinds]
          + ["memory KiB/dev", "args KiB/dev", "opt state KiB/dev", "temps KiB/dev"]
          + (["step ms (ratio)", "examples/s", "eval ms (ratio)"] if timed else []))
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [_label(r), f"`{r['mesh']}`"] + ([f"`{r['layout']}`"] if layouts else [])
    if r["status"] != "done":
      lines.append("| " + " | ".join(cells + [f"skipped: {r['reason']}"]
                                     + [""] * (len(head) - len(cells) - 1)) + " |")
      continue
    for k in kinds:
      c = k.replace("-", "_")
      cells.append(f"{_kib(r[c + '_bytes'])} ({r[c + '_count']})")
    cells += [_kib(r.get(k)) for k in ("memory_bytes", "argument_bytes", "opt_state_bytes",
                                     "temp_bytes")]
    if timed:
      eps = r.get("examples_per_s")
      cells += [_ratio(r.get("step_ms"), r.get("step_ratio")),
                "-" if eps is None else f"{eps:,.0f}",
                _ratio(r.get("eval_ms"), r.get("eval_ratio"))]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _base_ratio(rows, r, key) -> float | None:
  base = next((b for b in rows if b["variant"] == r["baseline"]), None)
  if base is None or r.get(key) is None or not base.get(key):
    return None
  return r[key] / base[key]


def pod_table(rows: list[dict], baseline_name: str = "baseline") -> str:
  """Compiled for a TPU slice: memory per device, collectives per step (MiB), the modelled
  collective, train and eval step ms with their ratios to the baseline, predicted minutes."""
  kinds = _kinds(rows)
  head = (["variant", "train memory GiB/dev"] + [f"{k} MiB" for k in kinds]
          + ["collectives ms", f"train step ms (vs {baseline_name})",
             f"eval step ms (vs {baseline_name})", "minutes"])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    if r["status"] != "done" or r.get("model_step_ms") is None:
      why = r.get("reason") or f"does not fit: {r.get('refused')}"
      lines.append(f"| {r['label']} | {why} |" + " |" * (len(head) - 2))
      continue
    t = _base_ratio(rows, r, "model_step_ms") or 1.0
    e = r.get("eval_model_ms")
    ev = "-" if e is None else f"{e:.2f} ({_base_ratio(rows, r, 'eval_model_ms') or 1.0:.2f}x)"
    minutes = r.get("predicted_minutes")
    lines.append("| " + " | ".join(
        [r["label"], f"{r['memory_bytes'] / 2**30:.2f}"]
        + [_mib(r[f"{k.replace('-', '_')}_bytes"]) for k in kinds]
        + [f"{r['collective_ms']:.2f}", f"{r['model_step_ms']:.2f} ({t:.2f}x)", ev,
           "-" if minutes is None else f"{minutes:.2f}"]) + " |")
  return "\n".join(lines)


def target_summary(rows: list[dict]) -> list[dict]:
  """Per variant (in order): runs, how many reached the target, time to target mean/min/max
  over the seeds that reached it, the ratio of its mean to its baseline's."""
  out: dict[str, dict] = {}
  for r in rows:
    s = out.setdefault(r["variant"], {"variant": r["variant"], "label": r["label"],
                                      "baseline": r["baseline"], "status": r["status"],
                                      "reason": r.get("reason"), "runs": 0, "times": [],
                                      "epochs": [], "step_ms": [], "resumed": False})
    s["resumed"] |= bool(r.get("resumed"))
    if r["status"] != "done":
      continue
    s["runs"] += 1
    if r.get("step_ms") is not None:
      s["step_ms"].append(r["step_ms"])
    if r["ending"] == "success":
      s["times"].append(r["time_to_train_s"])
      s["epochs"].append(r["epochs"])
  for s in out.values():
    t = s["times"]
    s.update(reached=len(t), mean_s=statistics.mean(t) if t else None,
             min_s=min(t) if t else None, max_s=max(t) if t else None)
  for s in out.values():
    base = out.get(s["baseline"])
    s["ratio"] = (s["mean_s"] / base["mean_s"] if base and base["mean_s"] and s["mean_s"]
                  else None)
  return list(out.values())


def target_table(rows: list[dict]) -> str:
  lines = ["| variant | runs reaching the target | time to target s: mean (ratio) | min | max | "
           "epochs (mean) | step ms (median over runs) |", "|" + "---|" * 7]
  for s in target_summary(rows):
    if s["status"] != "done":
      lines.append(f"| {s['label']} | skipped: {s['reason']} |" + " |" * 5)
      continue
    mean = _sec(s["mean_s"]) + ("" if s["ratio"] is None else f" ({s['ratio']:.2f})")
    lines.append(
        f"| {_label(s)} | {s['reached']}/{s['runs']} | {mean} | {_sec(s['min_s'])} | "
        f"{_sec(s['max_s'])} | "
        f"{'-' if not s['epochs'] else format(statistics.mean(s['epochs']), '.2f')} | "
        f"{'-' if not s['step_ms'] else format(statistics.median(s['step_ms']), '.1f')} |")
  return "\n".join(lines)
