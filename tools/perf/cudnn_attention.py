"""`--attention=cudnn` against `--attention=xla` on this machine's GPU
(`benchmarks.common.cudnn_check`: the cases and the bound).

  python -m tools.perf.cudnn_attention     (`.ci/accelerator` runs it)

Prints the largest difference of each output and gradient, relative to the largest value, and
exits 0 when every one is within the bound, 1 when one is not, 2 (one `error:` line) on a
machine without an NVIDIA GPU.
"""

from __future__ import annotations

import sys

from benchmarks.common import cudnn_check
from runtime.errors import UserError


def main() -> int:
  try:
    cudnn_check.check_backend("cudnn", compared=False)
    diffs = cudnn_check.compare()
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  bad = cudnn_check.over(diffs)
  for name, d in diffs.items():
    print(f"{name:36s} {d:.2e}"
          + (f"  over {cudnn_check.TOLERANCE:.2e}" if name in bad else ""))
  print("cudnn attention equals xla's within bfloat16 rounding" if not bad else
        f"cudnn attention differs from xla's: {', '.join(bad)}")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
