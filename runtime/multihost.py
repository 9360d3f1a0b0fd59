"""Multi-host runs: starting every process together, and ending them together.

`maybe_initialize_distributed` starts jax's distributed runtime (a coordinator and N processes,
or a TPU pod's own discovery) with deadlines of our own on every wait, and a watchdog thread
that ends a process with one `error:` line and exit status 6 when a peer is lost, instead of a
hang. `exit_process` is where every run ends (`harness.cli.run_main`); `claim_ending` makes
sure one thread of a process writes its last words.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import socket
import sys
import threading
import time

import jax
from jax._src import distributed

from runtime.errors import EXIT_CRASHED, EXIT_PEER_LOST, PeerLost, RunEnded, UserError


def maybe_initialize_distributed(coordinator_address: str | None, num_processes: int | None,
                                 process_id: int | None, timeout_s: float = 300.0) -> None:
  """Starts multi-host JAX when a coordinator is given (flags or MESHPERF_COORDINATOR/JAX_* env).

  On TPU pods `jax.distributed.initialize()` discovers everything itself: pass
  `--coordinator_address=auto`.

  `timeout_s` (--coordinator_timeout_s) bounds every wait on the other processes. At start: a
  process other than 0 that cannot reach the coordinator's port raises PeerLost; any process
  still waiting for the others to join after `timeout_s` prints one `error:` line and exits with
  status 6 (jax itself would abort from C++ with a stack trace, later). During the run: a
  watchdog (`_watch_peers`) ends this process the same way when another one has been silent,
  or has ended, for `timeout_s`. jax's own heartbeat and start deadlines are set well past
  `timeout_s`, so these checks come first.
  """
  coordinator_address = coordinator_address or os.environ.get("MESHPERF_COORDINATOR")
  if not coordinator_address:
    return
  if not timeout_s > 0:
    raise UserError(f"--coordinator_timeout_s={timeout_s:g}: must be positive (seconds)")
  jax_timeout = int(2 * timeout_s) + 10    # jax's deadlines: after ours, never before
  kw = dict(initialization_timeout=jax_timeout, heartbeat_timeout_seconds=jax_timeout,
            shutdown_timeout_seconds=jax_timeout)
  deadline = time.monotonic() + timeout_s
  if coordinator_address == "auto":
    where = "the coordinator the TPU pod names"
    with _deadline(deadline, lambda: PeerLost(
        f"the processes did not all join at {where} within {timeout_s:g} s "
        f"(--coordinator_timeout_s): check that every host of the slice runs the same command, "
        f"or raise --coordinator_timeout_s")):
      try:
        jax.distributed.initialize(**kw)
      except ValueError as e:            # no cluster environment jax recognizes
        raise UserError(
            f"--coordinator_address=auto: jax found no cluster to join here "
            f"({str(e).splitlines()[0]}); auto works where jax discovers the processes itself "
            f"(a Cloud TPU VM slice, SLURM, Open MPI); elsewhere pass "
            f"--coordinator_address=HOST:PORT --num_processes=N --process_id=i") from None
  else:
    if num_processes is None or process_id is None:
      raise UserError("--coordinator_address needs --num_processes and --process_id")
    if not 0 <= process_id < num_processes:
      raise UserError(f"--process_id={process_id}: choose 0..{num_processes - 1} "
                      f"(--num_processes={num_processes})")
    if os.environ.get("JAX_PLATFORMS", jax.config.jax_platforms or "") == "cpu":
      jax.config.update("jax_cpu_collectives_implementation", "gloo")   # CPU processes
    if process_id != 0:
      _wait_for_port(coordinator_address, deadline, lambda: PeerLost(
          f"process {process_id} of {num_processes} could not reach the coordinator at "
          f"{coordinator_address} (process 0) within {timeout_s:g} s (--coordinator_timeout_s): "
          f"start process 0 with the same --coordinator_address, check the host and port, or "
          f"raise --coordinator_timeout_s"))
    with _deadline(deadline, lambda: PeerLost(
        f"the {num_processes} processes did not all join at {coordinator_address} within "
        f"{timeout_s:g} s (--coordinator_timeout_s): start every process 0..{num_processes - 1} "
        f"with the same --coordinator_address and --num_processes, or raise "
        f"--coordinator_timeout_s")):
      jax.distributed.initialize(coordinator_address=coordinator_address,
                                 num_processes=num_processes, process_id=process_id, **kw)
  _watch_peers(coordinator_address, timeout_s)


_ENDING = threading.Lock()
ENDING_GRACE_S = 30.0     # how long a second ending waits for the first to end the process


def claim_ending() -> bool:
  """True for the first of this process's threads to end it (the main thread's error handling in
  `harness.cli.run_main`, a watchdog's `die`): only that one writes the process's last
  words, so a lost peer seen by both at once is one `error:` line, not two. The others wait for
  it to end the process (`ENDING_GRACE_S`, then end it themselves, quietly)."""
  return _ENDING.acquire(blocking=False)


def die(error: RunEnded, claimed: bool = False) -> None:
  """Ends this process from any thread, as `harness.cli.run_main` ends a RunEnded error:
  one `error:` line and the error's status. For when the main thread is stuck in the runtime
  (waiting on a collective of a dead peer) and cannot raise. `claimed`: the caller holds
  `claim_ending()` already."""
  if not claimed and not claim_ending():
    time.sleep(ENDING_GRACE_S)
    os._exit(error.status)
  try:
    sys.stdout.flush()
    print(f"error: {error}", file=sys.stderr, flush=True)
    _last_words_said()
    if _WATCH and not _WATCH["stop"].is_set():   # tell the others why (a hang: status 8)
      _mark_failed_within(error.status, str(error))
  finally:
    os._exit(error.status)


def _last_words_said() -> None:
  """Points this process's stderr at /dev/null once its last words are written and it is about
  to `os._exit`: the runtime's own threads, which see the same lost peer, would otherwise log
  after them (jax's "Terminating process because the JAX distributed service detected fatal
  errors", a Gloo or gRPC error), and the user's last line would be theirs, not ours. Only for
  the fast endings, where nothing after this line is ours. Never in the way of the ending: where
  /dev/null cannot be opened (no file descriptor left), stderr stays as it is."""
  sys.stderr.flush()
  try:
    null = os.open(os.devnull, os.O_WRONLY)
  except OSError:
    return
  os.dup2(null, 2)
  os.close(null)


@contextlib.contextmanager
def _deadline(deadline: float, error):
  """Ends the process with `error()` (see `die`) if the block has not finished by `deadline`
  (time.monotonic()). jax's start blocks in C++ (releasing the GIL), so a timer can end it."""
  done = threading.Event()

  def watch():
    if not done.wait(max(0.0, deadline - time.monotonic())):
      die(error())

  threading.Thread(target=watch, name="meshperf-start-deadline", daemon=True).start()
  try:
    yield
  finally:
    done.set()


def _wait_for_port(address: str, deadline: float, error) -> None:
  """Retries a TCP connection to host:port until it succeeds; raises `error()` at `deadline`."""
  host, _, port = address.rpartition(":")
  host = host.strip("[]")
  while True:
    left = deadline - time.monotonic()
    try:
      with socket.create_connection((host, int(port)), timeout=max(0.1, min(left, 5.0))):
        return
    except (OSError, ValueError):
      if left <= 0:
        raise error() from None
      time.sleep(min(0.5, max(0.0, left)))


_ALIVE = "meshperf/alive/"
_WATCH: dict = {}     # the running watchdog: client, key, stop event, interval, this process


def _watch_peers(coordinator_address: str, timeout_s: float) -> None:
  """Starts a daemon thread that ends this process (one `error:` line, status 6) when a peer
  is lost, instead of a hang.

  jax 0.10 has no Python hook for that: the main thread waits forever on a gloo collective whose
  peer died, until the coordination service's heartbeat check aborts every process from C++
  (SIGABRT, a stack trace); a Python `missed_heartbeat_callback` fails in jaxlib (std::bad_cast).
  So each process heartbeats a counter in the coordination service's key-value store every
  `timeout_s / 10` s (at most 5 s). Process 0 reads every counter: a process whose counter has
  not moved for `timeout_s` (killed, crashed, hung), or that marked itself failed, is lost:
  process 0 marks itself failed with the reason, waits two beats for the others to read it, and
  ends. The others read process 0's counter only (one key each, whatever the process count)
  and end when it marks itself failed, when it stops moving for `timeout_s`, or when the
  coordinator does not answer for as long. A process ending normally marks itself "done" at
  exit (before jax's own shutdown barrier)."""
  client = getattr(getattr(distributed, "global_state", None), "client", None)
  me, count = jax.process_index(), jax.process_count()
  if client is None or count < 2:
    return
  stop = threading.Event()
  interval = min(5.0, max(0.2, timeout_s / 10))
  key = f"{_ALIVE}{me}"

  def read():
    if me == 0:
      return dict(client.key_value_dir_get(_ALIVE))
    try:
      return {f"{_ALIVE}0": client.key_value_try_get(f"{_ALIVE}0")}
    except Exception as e:
      if "NOT_FOUND" in str(e):
        return {}
      raise

  def end(error: PeerLost):
    # Claimed before telling the others: while process 0 waits for them to read it, they end,
    # and its main thread's collective fails; that second ending must not write its own line.
    if not claim_ending():
      die(error)                              # the main thread is ending the process already
    if me == 0 and not stop.is_set():          # tell the others why before the service goes
      _mark_failed(error.status, str(error), wait=count > 2)
    die(error, claimed=True)

  def beat():
    start = time.monotonic()
    seen = {p: (None, start) for p in (range(count) if me == 0 else [0]) if p != me}
    failing_since, n = None, 0
    while not stop.is_set():
      n += 1
      now = time.monotonic()
      try:
        client.key_value_set(key, str(n), allow_overwrite=True)
        values = read()
        failing_since = None
      except Exception as e:
        if stop.is_set():
          return
        failing_since = failing_since or now
        if now - failing_since > timeout_s:
          die(PeerLost(f"lost the coordinator at {coordinator_address} (process 0): no answer "
                        f"for {timeout_s:g} s (--coordinator_timeout_s; last: "
                        f"{str(e).strip().splitlines()[0][:200]}); {_RESTART}"))
        stop.wait(interval)
        continue
      for p, (last, since) in seen.items():
        value = values.get(f"{_ALIVE}{p}")
        if stop.is_set():
          return
        if value and value.startswith("failed:"):
          end(PeerLost(_ended(p, count, value)))
        if value != last:
          seen[p] = (value, now)
        elif now - since > timeout_s:
          how = ("ended (its own output says why)" if value == "done" else
                 "sent no heartbeat" if value is None else
                 "stopped sending heartbeats (killed, crashed or hung)")
          end(PeerLost(f"lost process {p} of {count}: it {how} {now - since:.0f} s ago, more "
                       f"than --coordinator_timeout_s={timeout_s:g} while process {me} still "
                       f"runs; {_RESTART}"))
      stop.wait(interval)

  def done():
    stop.set()
    try:
      client.key_value_set(key, "done", allow_overwrite=True)
    except Exception:
      pass

  atexit.register(done)   # runs before jax's own atexit shutdown (registered earlier)
  _WATCH.update(client=client, key=key, stop=stop, interval=interval, process=me, count=count)
  threading.Thread(target=beat, name="meshperf-peer-watchdog", daemon=True).start()


_RESTART = "restart every process (--resume continues from the last checkpoint)"


def _ended(p: int, count: int, value: str) -> str:
  """The line for peer `p`, which marked itself failed (`value`: "failed:STATUS:WHY")."""
  status, _, why = value[len("failed:"):].partition(":")
  why = f": {why}" if why else f" (its own output says why); {_RESTART}"
  return f"process {p} of {count} ended with status {status}{why}"


PEER_READ_S = 5.0    # how long a failed collective waits to read why a peer ended


def _peer_ended() -> str | None:
  """`_ended` for the first other process that marked itself failed, read once from the
  coordination service (None if none did, or if the service does not answer in PEER_READ_S).
  A peer marks itself before it exits, so when its exit fails a collective here, the mark is
  there to read: the line names the peer and why it ended, not the broken connection."""
  client, me, count = _WATCH["client"], _WATCH["process"], _WATCH["count"]
  found: list[str] = []

  def read():
    for p in range(count):
      if p == me:
        continue
      try:
        value = client.key_value_try_get(f"{_ALIVE}{p}")
      except Exception:     # NOT_FOUND (no beat yet), or the service is gone
        continue
      if value and value.startswith("failed:"):
        found.append(_ended(p, count, value))
        return

  reader = threading.Thread(target=read, name="meshperf-peer-ended", daemon=True)
  reader.start()
  reader.join(PEER_READ_S)
  return found[0] if found else None


def _mark_failed_within(status: int, why: str = "") -> None:
  """`_mark_failed` that gives up after its own wait and a few seconds more: a process ending
  must end even when the coordination service does not answer (a frozen coordinator)."""
  marker = threading.Thread(target=_mark_failed, args=(status, why), daemon=True,
                            name="meshperf-mark-failed")
  marker.start()
  marker.join(2 * _WATCH["interval"] + 6)


def _mark_failed(status: int, why: str = "", wait: bool = True) -> None:
  """Marks this process failed for the watchdogs of the others; as process 0 (the coordinator,
  which the others cannot outlive), with `wait`, waits two beats so that they read it first."""
  _WATCH["stop"].set()
  try:
    _WATCH["client"].key_value_set(_WATCH["key"], f"failed:{status}:{why}", allow_overwrite=True)
    if wait and _WATCH["process"] == 0:
      time.sleep(2 * _WATCH["interval"] + 1)
  except Exception:
    pass


_FAST_EXIT = (EXIT_CRASHED, EXIT_PEER_LOST)


EXIT_JOIN_S = 10.0   # how long an ending waits for the threads still running to finish


def _stuck_threads(wait_s: float) -> list[threading.Thread]:
  """The non-daemon threads still alive after waiting up to `wait_s` for them all."""
  deadline = time.monotonic() + wait_s
  others = [t for t in threading.enumerate()
            if t is not threading.current_thread() and not t.daemon]
  for t in others:
    # threading.Thread's own join: a subclass's may raise on a timeout (orbax's does).
    threading.Thread.join(t, max(0.0, deadline - time.monotonic()))
  return [t for t in others if t.is_alive()]


def exit_process(code: int, why: str = ""):
  """Ends the process with status `code` (`harness.cli.run_main` ends here).

  Multi-host, after a crash or a lost peer (statuses 3 and 6, which may hit one process only):
  this process marks itself failed (with `why`, its `error:` line, for theirs), so the others
  end at once (status 6, naming it) instead of waiting on it in a collective, and it skips
  jax's shutdown barrier, which would wait for them and then abort from C++. Every other
  status is an end all processes reach together (done, epoch limit, bad input, divergence,
  preemption, a failed checkpoint): a normal exit through the barrier, which does not wait
  more than EXIT_JOIN_S for threads that are still running."""
  if not _WATCH or code not in _FAST_EXIT:
    if _stuck_threads(EXIT_JOIN_S):
      # Python joins every non-daemon thread before it exits; a library's thread that waits
      # for what will never come (orbax's commit threads after a checkpoint that could not be
      # written wait on signals forever) would hold the process. The exit handlers (jax's
      # shutdown barrier among them) still run; the threads do not.
      sys.stdout.flush()
      sys.stderr.flush()
      atexit._run_exitfuncs()
      os._exit(code)
    sys.exit(code)
  sys.stdout.flush()
  _last_words_said()
  _mark_failed_within(code, why)
  os._exit(code)


_COLLECTIVE_LOST = re.compile(r"Gloo [\w -]*failed|GetKeyValue\(\) timed out|"
                              r"Connection (closed|reset) by peer|coordination service")


def peer_lost(error: BaseException) -> PeerLost | None:
  """A PeerLost for an error of a multi-host run that says another process is gone or missing
  (a gloo collective that failed or timed out, the coordination service unreachable; jax raises
  them as JaxRuntimeError or ValueError); None for anything else (a bug: its traceback is
  printed). When a peer marked itself failed before it went (`exit_process`, `die`), the
  error names that peer and its reason instead of the broken connection."""
  if not _WATCH:
    return None
  first = (str(error).strip().splitlines() or [""])[0]
  if not _COLLECTIVE_LOST.search(str(error)):
    return None
  named = _peer_ended()
  if named is not None:
    return PeerLost(named)
  return PeerLost(f"a collective with the other processes failed ({first[:300]}): another "
                  f"process died, hangs or reached it more than 30 s later; see the others' "
                  f"output, then restart every process (--resume continues from the last "
                  f"checkpoint)")
