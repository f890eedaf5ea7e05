"""Is a process of this machine still there? (Leases, the local farm's daemons, the stand-in adbd.)"""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """A process with this pid exists (perhaps another user's, perhaps a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_running(pid: int) -> bool:
    """pid exists and is not a zombie (a daemon's zombie waits for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return pid_alive(pid)
    return stat[stat.rfind(")") + 2] != "Z"
