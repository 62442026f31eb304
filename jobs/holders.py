"""Who holds a lease, and when a starting worker may know that holder is gone.

A lease normally ends when it expires: another worker cannot tell a dead
holder from a slow one. A worker that starts can know better in two cases,
and takes the gone holder's leases back at once (`Store.take_over`):

- the holder was a process of this very host. The default worker id names
  the host's boot (`/proc/sys/kernel/random/boot_id`), the pid namespace,
  the pid and the pid's start time (`/proc/<pid>/stat`); a holder with the
  same boot and namespace whose pid no longer runs, or runs a process that
  started at another time (the pid was reused), or is a zombie, is gone.
  Another boot, namespace or host name (another host, another container,
  a machine cloned with its boot id) is never judged: its pids are not ours
  to look at. Where /proc is missing the id carries no boot, and nothing
  is judged;
- the holder had this worker's own explicit id (`run_worker --worker-id`),
  which the deployment runs as one process at a time (a container
  orchestrator's stable name): at start, before it claims anything, the
  leases under that id are the previous process's.
"""

import os
import re
import socket
import uuid
from pathlib import Path

from .selectors import lease_holders

__all__ = ["worker_id", "this_place", "gone", "gone_holders", "process_start"]

PROC = Path("/proc")
BOOT_ID = PROC / "sys/kernel/random/boot_id"

# host:pid:start:boot:pidns — the place (boot and pid namespace) last.
_LOCAL_ID = re.compile(r"(?P<host>[^:]*):(?P<pid>\d+):(?P<start>\d+):(?P<place>[0-9a-f-]{36}:\d+)")


def _boot_id() -> str | None:
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        return None
    return boot if re.fullmatch(r"[0-9a-f-]{36}", boot) else None


def _pid_namespace() -> str | None:
    try:
        link = os.readlink(PROC / "self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return None
    found = re.fullmatch(r"pid:\[(\d+)\]", link)
    return found.group(1) if found else None


def this_place() -> str | None:
    """This process's boot and pid namespace (`boot:inode`), where pids mean
    the same processes; None where /proc cannot say."""
    boot, namespace = _boot_id(), _pid_namespace()
    return f"{boot}:{namespace}" if boot and namespace else None


def _stat(pid: int) -> tuple[str, int] | None:
    """`pid`'s state letter and start time (clock ticks since boot), or None
    when it cannot be read."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # After the command name, which may hold spaces and parentheses.
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def process_start(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot; None if unknown."""
    stat = _stat(pid)
    return stat[1] if stat else None


def worker_id() -> str:
    """A fresh identity per start: `host:pid:start:boot:pidns` where /proc
    tells them (so a later worker of this host can know this one is gone),
    else `host:pid:random`. Never the identity of an earlier process: a
    restarted one does not inherit the fence of the one it replaces."""
    pid = os.getpid()
    place, start = this_place(), process_start(pid)
    if place and start is not None:
        return f"{socket.gethostname()}:{pid}:{start}:{place}"
    return f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}"


def gone(holder: str, *, place: str | None) -> str | None:
    """Why the worker `holder` is known to be gone, judged from `place`
    (`this_place()`); None when it may be alive or cannot be judged from
    here (another boot, another namespace, an id without a place)."""
    found = _LOCAL_ID.fullmatch(holder)
    if place is None or found is None or found["place"] != place:
        return None
    if found["host"] != socket.gethostname():
        return None  # the same boot under another name: a cloned machine, not ours to judge
    pid, start = int(found["pid"]), int(found["start"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"process {pid} of this host is no longer running"
    except PermissionError:
        pass  # it exists (another user's): its stat says which process it is
    stat = _stat(pid)
    if stat is None:
        return None
    state, started = stat
    if started != start:
        return f"process {pid} of this host ended (its pid now names a process started later)"
    if state in ("Z", "X"):
        return f"process {pid} of this host has exited"
    return None


def gone_holders(*, restarted: str | None = None) -> dict[str, str]:
    """The lease holders a starting worker knows are gone, each with why:
    this place's workers whose process is gone (`gone`), and `restarted`,
    the worker's own stable id (the previous process under it)."""
    found = {}
    place = this_place()
    if place:
        for holder in lease_holders(place=place):
            why = gone(holder, place=place)
            if why:
                found[holder] = why
    if restarted:
        found[restarted] = "a worker restarted under the same stable worker id, which runs one process at a time"
    return found
