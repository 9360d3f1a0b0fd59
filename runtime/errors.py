"""How a run ends, for the user and for the scripts that launch it: one error type a user sees
(a single line saying what is wrong and how to fix it) and the exit statuses (docs/outputs.md),
all defined here so every entry point agrees."""

# Exit statuses of `./run.sh <benchmark>` (and the other verbs where they apply).
EXIT_SUCCESS = 0        # the quality target was reached
EXIT_EPOCH_LIMIT = 1    # stopped at --max_epochs without reaching the target
EXIT_BAD_INPUT = 2      # bad input: one `error:` line, nothing trained, nothing left behind
EXIT_CRASHED = 3        # an unexpected error (a bug): its traceback is printed
EXIT_DIVERGED = 4       # a non-finite loss: run_stop aborted, the last good checkpoint kept
EXIT_PREEMPTED = 5      # SIGTERM, SIGHUP or SIGINT: in training, the step finished and a
                        # checkpoint written (resumable); before it, nothing to save
EXIT_PEER_LOST = 6      # multi-host: the coordinator or another process was lost or unreachable
EXIT_CHECKPOINT = 7     # a checkpoint could not be written (e.g. a full disk); the previous kept
EXIT_HUNG = 8           # no progress for --hang_timeout_s (a stuck collective or data loader)
# The verbs that check rather than train (`./run.sh check`, `./run.sh dryrun`): 1 when a check
# fails (a log the checker rejects, a dry run's FAIL verdict).
EXIT_CHECK_FAILED = 1


class UserError(ValueError):
  """Bad input from the user (flags, specs, data paths).

  Entry points print `error: <message>` and exit with status 2, no traceback. The message is
  one line whatever it quotes: a line break in a path or a value is shown as `\\n`.
  """

  def __str__(self) -> str:
    return one_line(super().__str__())


# What Python's str.splitlines breaks a line at (its documentation's table of line boundaries).
_BREAKS = {c: c.encode("unicode_escape").decode() for c in
           "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}


def one_line(text: str) -> str:
  """`text` with its line breaks (every boundary str.splitlines knows) written as escapes
  (`\\n`, `\\x1e`): one line of a terminal or a log."""
  return text.translate(str.maketrans(_BREAKS)) if any(c in text for c in _BREAKS) else text


class RunEnded(Exception):
  """A run that stopped for a reason the user must act on (not a bug): entry points print
  `error: <message>` and exit with `status`, no traceback."""
  status = EXIT_CRASHED


class Stopped(RunEnded):
  """SIGTERM or SIGHUP outside the training loop (the setup, compiling, a verb's own work):
  nothing was being trained, so there is nothing to checkpoint; the same command starts again."""
  status = EXIT_PREEMPTED


class Hung(RunEnded):
  """Alive but without progress for --hang_timeout_s (`harness.watchdog`)."""
  status = EXIT_HUNG


class PeerLost(RunEnded):
  """Multi-host: the coordinator could not be reached in time, or a peer process died."""
  status = EXIT_PEER_LOST


class CheckpointFailed(RunEnded):
  """A checkpoint could not be written; the previous checkpoint is still whole."""
  status = EXIT_CHECKPOINT

