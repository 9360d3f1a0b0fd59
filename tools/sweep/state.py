"""A sweep's state, `<output_dir>/sweep.jsonl` (`tools.sweep`): the first line holds the
sweep's settings (benchmark, depth, steps, rounds, runs, topology, config, variants) and the
command, each further line one finished record (a variant, or a variant's run of one seed),
appended and synced to disk as it finishes. Rerunning the sweep into the folder skips what is
recorded; a line cut short by a killed process, and what follows it, is dropped and redone; a
folder of a sweep with other settings, or a folder that is not a sweep's, is refused before
anything is written.
"""

from __future__ import annotations

import json
import os
import time
import uuid

from runtime.errors import UserError

STATE = "sweep.jsonl"


def _differences(there: dict, here: dict) -> list[str]:
  out = []
  for k in here:
    a, b = there.get(k), here[k]
    if a == b:
      continue
    if k == "config" and isinstance(a, dict):
      out += [f"--{f}: {a.get(f)} there, {b[f]} here" for f in b if a.get(f) != b[f]]
    elif k == "variants" and isinstance(a, list):
      out.append(f"variants: {', '.join(v['key'] for v in a)} there, "
                 f"{', '.join(v['key'] for v in b)} here")
    elif isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
      out.append(f"{k} differ")
    else:
      out.append(f"{k}: {a} there, {b} here")
  return out


class State:
  """sweep.jsonl: the settings, then one record per finished variant (or seed)."""

  def __init__(self, output_dir: str, settings: dict):
    self.session = uuid.uuid4().hex[:12]    # this invocation's records (a resumed sweep mixes)
    self.path = os.path.join(output_dir, STATE)
    self.output_dir, self.settings, self.records = output_dir, settings, []
    self._valid_bytes = None
    if os.path.isdir(output_dir) and os.listdir(output_dir):
      if not os.path.exists(self.path):
        raise UserError(f"--output_dir={output_dir} holds files but no {STATE}: it is not a "
                        f"sweep's folder; choose a new or empty folder")
      self._load()

  def _load(self) -> None:
    with open(self.path, "rb") as f:
      data = f.read()
    lines, good = data.split(b"\n"), 0
    try:
      head = json.loads(lines[0])["sweep"]
    except (ValueError, KeyError, TypeError):
      head = None
    if not isinstance(head, dict):
      raise UserError(f"{self.path}: its first line is not a sweep's settings; choose a new "
                      f"--output_dir")
    diff = _differences(head, self.settings)
    if diff:
      raise UserError(f"--output_dir={self.output_dir} holds a sweep with other settings "
                      f"({'; '.join(diff[:3])}); rerun it as it was run (its command is in "
                      f"{STATE}) or choose another --output_dir")
    good = len(lines[0]) + 1
    for n, line in enumerate(lines[1:], 2):
      try:
        record = json.loads(line)["record"]
      except (ValueError, KeyError, TypeError):
        break           # a line cut short by a killed process: it and what follows are redone
      if not (isinstance(record, dict) and isinstance(record.get("variant"), str)
              and isinstance(record.get("status"), str)):
        raise UserError(f"{self.path}: line {n} is not a record a sweep wrote "
                        f"({line[:60].decode(errors='replace')}): the file was edited; mend or "
                        f"remove that line, or choose a new --output_dir")
      self.records.append(record)
      good += len(line) + 1
    self._valid_bytes = min(good, len(data))

  def start(self, command: str) -> None:
    os.makedirs(self.output_dir, exist_ok=True)
    if self._valid_bytes is None:
      with open(self.path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"sweep": self.settings, "command": command}) + "\n")
    else:
      with open(self.path, "r+b") as f:
        f.truncate(self._valid_bytes)

  def add(self, row: dict) -> None:
    row = {**row, "session": self.session, "finished": time.time()}
    self.records.append(row)
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps({"record": row}, default=float) + "\n")
      f.flush()
      os.fsync(f.fileno())

  def done(self, key: str, seed_index: int | None = None) -> bool:
    return any(r["variant"] == key and (r["status"] == "skipped" or seed_index is None
                                        or r.get("seed_index") == seed_index)
               for r in self.records)
