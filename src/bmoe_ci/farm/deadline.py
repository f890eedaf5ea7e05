"""Per-entry deadlines for engine plans, enforced on the device.

`bmoe batch` runs a plan's entries one after the other and prints one JSON line per finished entry.
A hung entry must cost one entry deadline, not the plan's whole budget, and must be killed on the
device even if the controller or the link is gone. So a plan runs under a small POSIX ``sh`` watcher
(:data:`WATCH`, sent with the command like every other script: no file to install on the device):

* the engine writes its results to a temporary file in the store (``store/.tmp-batch-*``, swept by the
  next locked push if the watcher itself is killed);
* the engine starts in its own process group (``setsid`` where the device has it: util-linux,
  busybox, toybox; else the shell's job control, ``set -m``, as on macOS), so a kill reaches everything
  the engine command started: an exec prefix's children, a forked helper. Its pid is the group's id
  (``setsid`` does not fork when its caller is not a group leader, which a background job without job
  control never is);
* a background loop, in a process group of its own too, looks at the file's size once a second: growth
  is progress (it says so on stderr, which the controller's no-progress watchdog sees) and restarts the
  clock; ``DEADLINE`` seconds without growth kill the engine's process group with ``SIGKILL`` and print
  :data:`DEADLINE_MARK` on stderr;
* the loop also kills the engine's group when the watcher's own shell is gone (killed with its
  controller, or by the command's own deadline, ``timeout -s KILL`` on ssh devices or a process-group
  kill on local ones, which no longer reach the engine's group directly: that is why the loop lives
  outside the command's group and outlives it by at most a second);
* when the engine ends, whatever it left in its group is killed, the results are copied to stdout and
  the file removed; the exit status is the engine's (137 when the watcher killed it:
  :func:`deadline_hit` tells that from a crash).

The loop's ``sleep`` has its output closed, so an orphaned ``sleep`` never holds the command's pipes
open. Lines the watcher adds to stderr start with ``__bmoe_ci_`` and :func:`strip_marks` removes them.
"""

from __future__ import annotations

import re
import secrets

from .transports.base import Transport, name_script

DEADLINE_MARK = "__bmoe_ci_entry_deadline__"
#: Seconds of silence past the entry deadline before the controller itself gives up on a plan.
IDLE_GRACE = 30.0
#: The watcher says it is alive at least this often (seconds), growth or not.
ALIVE_S = 5
#: Missed alive lines after which a link is taken for hung (with at least ``connect_timeout`` of silence).
ALIVE_MISSED = 3


def silence_limit(entry_deadline: float, connect_timeout: float) -> float:
    """Seconds without a byte from a watched command after which the controller takes the device or its
    link for hung: three missed alive lines (at least ``connect_timeout``), never more than the entry
    deadline plus :data:`IDLE_GRACE`."""
    return min(entry_deadline + IDLE_GRACE, max(float(connect_timeout), float(ALIVE_S * ALIVE_MISSED)))


PROGRESS_MARK = "__bmoe_ci_progress__"

# $1 deadline (whole seconds), $2 result file, then the engine's argv (exec prefix included).
# The loop is a separate `sh -c` so that it can get its own process group too (see the module docstring);
# it takes $1 deadline, $2 result file, $3 engine pid (= its process group), $4 the watcher's pid.
WATCH = name_script(
    r"""
d=$1; f=$2; shift 2
parent=$$
loop='
d=$1; f=$2; pid=$3; parent=$4
last=0; idle=0; tick=0
while kill -0 "$pid" 2>/dev/null; do
  sleep 1 </dev/null >/dev/null 2>&1
  if ! kill -0 "$parent" 2>/dev/null; then
    kill -KILL -"$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null; rm -f "$f.pid"; exit 0
  fi
  n=$(wc -c <"$f" 2>/dev/null) || n=0
  tick=$((tick + 1))
  if [ "$n" -ne "$last" ]; then last=$n; idle=0; echo "__bmoe_ci_progress__ $n" >&2
  else idle=$((idle + 1)); [ $((tick % 5)) -eq 0 ] && echo "__bmoe_ci_alive__ $tick" >&2; fi
  if [ "$idle" -ge "$d" ]; then
    echo "__bmoe_ci_entry_deadline__ $d" >&2
    kill -KILL -"$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    exit 0
  fi
done
'
if command -v setsid >/dev/null 2>&1; then own=setsid; else own=; set -m 2>/dev/null; fi
exec 3<&0
$own "$@" <&3 3<&- >"$f" &
pid=$!
printf '%s\n' "$pid" > "$f.pid"
exec 3<&-
$own sh -c "$loop" bmoe-ci "$d" "$f" "$pid" "$parent" </dev/null &
w=$!
set +m 2>/dev/null
{ wait "$pid"; } 2>/dev/null; rc=$?
kill -KILL -"$pid" 2>/dev/null
kill "$w" 2>/dev/null; wait "$w" 2>/dev/null
cat "$f" 2>/dev/null; rm -f "$f" "$f.pid"
exit $rc
""",
    "plan watcher",
)


#: Shell function ``kill_leftovers STORE``: kills the engine of every plan whose watcher is gone but whose
#: engine still runs (its link was lost: nothing on the device noticed), then removes its files. A plan's
#: pid file ``store/.tmp-batch-*.pid`` names the engine's process group; it is killed only while that
#: process still has the plan's result file as its standard output (``/proc/PID/fd/1``), so a pid reused by
#: anything else is never touched. Prints ``killed PID`` for each.
KILL_LEFTOVERS_FN = r"""
kill_leftovers() {
  for p in "$1"/.tmp-batch-*.pid; do
    [ -f "$p" ] || continue
    f=${p%.pid}; pid=$(cat "$p" 2>/dev/null)
    case $pid in ''|*[!0-9]*) rm -f "$p"; continue;; esac
    if [ -e "/proc/$pid/fd/1" ] && [ "/proc/$pid/fd/1" -ef "$f" ]; then
      kill -KILL -"$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
      echo "killed $pid"
    fi
    rm -f "$p" "$f"
  done
}
"""

_KILL_LEFTOVERS = name_script(KILL_LEFTOVERS_FN + 'kill_leftovers "$1"\n', "kill leftover engines")


def kill_leftovers(transport: Transport, timeout: float) -> int:
    """Kill what plans of earlier commands left running on the device (see :data:`KILL_LEFTOVERS_FN`);
    returns how many engines were killed. Call it holding the device (its lease, or as its run)."""
    r = transport.sh(_KILL_LEFTOVERS, transport.path("store"), timeout=timeout)
    if r.infra is not None:
        raise r.infra
    return sum(1 for line in r.stdout.decode(errors="replace").splitlines() if line.startswith("killed "))


def watched_argv(argv: list[str], deadline_s: float, result_file: str) -> list[str]:
    """``argv`` (exec prefix included) under the watcher, with ``deadline_s`` rounded up to seconds."""
    secs = max(1, int(-(-deadline_s // 1)))
    return ["sh", "-c", WATCH, "bmoe-ci", str(secs), result_file, *argv]


def result_file_name() -> str:
    """A fresh name for the watcher's result file, under the store (swept with upload temporaries)."""
    return f"store/.tmp-batch-{secrets.token_hex(6)}"


# A line the watcher wrote. The engine and the watcher share the stderr pipe: when the engine's last
# write had no newline yet, the watcher's line is glued to it ("partial line__bmoe_ci_progress__ 42\n"),
# so a mark is found anywhere, not only at a line's start.
_MARK_LINE = re.compile(r"__bmoe_ci_(?:progress|entry_deadline|alive)__ \d+\n?")


def deadline_hit(stderr: bytes | str) -> bool:
    """Did the watcher kill the engine for running past the entry deadline?"""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    return DEADLINE_MARK + " " in text


def strip_marks(stderr: str) -> str:
    """The engine's own stderr: the watcher's lines removed, wherever they landed (a line the engine
    had not ended yet continues after the mark, as the engine wrote it)."""
    if "__bmoe_ci_" not in stderr:
        return stderr
    return _MARK_LINE.sub("", stderr)
