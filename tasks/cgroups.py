"""A control group per sandboxed run: memory, processes and CPU bounded, everything killed at
the end.

Memory counted by a cgroup includes what belongs to no process: pages of tmpfs files, SysV
shared memory and memfds are charged to the group of the task that touched them, so a program
cannot park memory outside its own limit, and the kernel's out-of-memory killer acts inside the
group (on the program), never on a neighbour. Both cgroup versions are used:

- v2 (one unified hierarchy): a child of this process's group with `memory.max`,
  `memory.swap.max` 0, `pids.max`, `cpu.max`, ended by `cgroup.kill`;
- v1 (a hierarchy per controller, as on older hosts and in some containers): a child in each of
  the memory (`memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` where swap is
  accounted), pids and cpu (`cpu.cfs_quota_us`) hierarchies, ended by killing every task listed.

Creating groups needs write access to this process's own group (root, or a delegated subtree);
where there is none, `RunGroup.create` returns None and the sandbox relies on its other bounds
(rlimits, capped tmpfs mounts, the seccomp filter, zeroed SysV limits).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Hierarchy:
    """Where one controller lives: the mount point, this process's group in it, and version."""

    mount: Path
    group: str  # path of this process's group inside the hierarchy, e.g. "/user.slice"
    version: int

    def own(self) -> Path:
        return self.mount / self.group.lstrip("/")


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of every cgroup mount, from mountinfo."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) > 4 and len(tail) > 2 and tail[0] in ("cgroup", "cgroup2"):
                point = fields[4].replace("\\040", " ")
                found.append((point, tail[0], set(tail[2].split(","))))
    return found


def _own_groups() -> dict[str, str]:
    """Controller (or "" for v2) → this process's group path, from /proc/self/cgroup."""
    out = {}
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _id, names, path = line.rstrip("\n").split(":", 2)
            for name in names.split(",") if names else [""]:
                out[name] = path
    return out


@cache
def hierarchies() -> dict[str, Hierarchy] | None:
    """Controller → where it can be used, or None when any of them is not writable here."""
    try:
        mounts, groups = _mounts(), _own_groups()
    except OSError:
        return None
    found: dict[str, Hierarchy] = {}
    for point, fstype, options in mounts:
        if fstype == "cgroup":
            for name in CONTROLLERS:
                if name in options and name in groups:
                    found.setdefault(name, Hierarchy(Path(point), groups[name], 1))
    v2 = next((Path(p) for p, fstype, _ in mounts if fstype == "cgroup2"), None)
    if v2 is not None and "" in groups:
        unified = Hierarchy(v2, groups[""], 2)
        for name in CONTROLLERS:
            if name not in found and _delegated(unified, name):
                found[name] = unified
    if set(found) != set(CONTROLLERS):
        return None
    if not all(os.access(h.own(), os.W_OK) for h in found.values()):
        return None
    return found


def _delegated(hierarchy: Hierarchy, name: str) -> bool:
    """Whether a v2 group made under ours can use controller `name` (enabling it for our
    children where the kernel allows)."""
    own = hierarchy.own()
    try:
        if name not in (own / "cgroup.controllers").read_text().split():
            return False
        if name not in (own / "cgroup.subtree_control").read_text().split():
            (own / "cgroup.subtree_control").write_text(f"+{name}")
    except OSError:  # not ours to change, or processes in our group (v2's no-internal rule)
        return False
    return True


class RunGroup:
    """The groups of one run (one per hierarchy in use); made by `create`."""

    def __init__(self, paths: dict[str, Path], versions: dict[Path, int]):
        self._paths = paths  # controller → group directory
        self._versions = versions

    @classmethod
    def create(cls, memory_mb: int, tasks: int, cpus: float = 1.0) -> RunGroup | None:
        """A new group with `memory_mb` of memory (swap none), at most `tasks` tasks
        (processes and threads) and `cpus` CPUs; None where cgroups cannot be used."""
        found = hierarchies()
        if found is None:
            return None
        name = f"dllmbench-{os.getpid()}-{secrets.token_hex(6)}"
        paths: dict[str, Path] = {}
        versions: dict[Path, int] = {}
        try:
            for controller, where in found.items():
                path = where.own() / name
                if path not in versions:
                    path.mkdir(mode=0o755)
                    versions[path] = where.version
                paths[controller] = path
        except OSError:
            cls(paths, versions).remove()
            return None
        group = cls(paths, versions)
        try:
            group._limit(memory_mb << 20, tasks, cpus)
        except OSError:
            group.remove()
            return None
        return group

    def _limit(self, memory: int, tasks: int, cpus: float) -> None:
        quota = max(1000, int(cpus * CPU_PERIOD_US))
        if self._version("memory") == 2:
            _write(self._paths["memory"] / "memory.max", memory)
            _write(self._paths["memory"] / "memory.swap.max", 0, optional=True)
        else:
            _write(self._paths["memory"] / "memory.limit_in_bytes", memory)
            _write(self._paths["memory"] / "memory.memsw.limit_in_bytes", memory, optional=True)
        _write(self._paths["pids"] / "pids.max", tasks)
        if self._version("cpu") == 2:
            _write(self._paths["cpu"] / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        else:
            _write(self._paths["cpu"] / "cpu.cfs_period_us", CPU_PERIOD_US)
            _write(self._paths["cpu"] / "cpu.cfs_quota_us", quota)

    def _version(self, controller: str) -> int:
        return self._versions[self._paths[controller]]

    def add(self, pid: int) -> None:
        """Move process `pid` (before it runs anything untrusted) into every group."""
        for path in self._versions:
            _write(path / "cgroup.procs", pid)

    def _tasks(self) -> set[int]:
        found: set[int] = set()
        for path in self._versions:
            with contextlib.suppress(OSError):
                found.update(int(x) for x in (path / "cgroup.procs").read_text().split())
        return found

    def kill(self, wait: float = 5.0) -> None:
        """Kill every process in the group and wait (up to `wait` s) until none is left."""
        for path, version in self._versions.items():
            if version == 2 and (path / "cgroup.kill").exists():
                _write(path / "cgroup.kill", 1, optional=True)
        deadline = time.monotonic() + wait
        while (left := self._tasks()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def memory_peak(self) -> int | None:
        """The most memory the group held at once, in bytes, where the kernel reports it."""
        path = self._paths["memory"]
        name = "memory.peak" if self._version("memory") == 2 else "memory.max_usage_in_bytes"
        try:
            return int((path / name).read_text())
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int:
        """How many processes of the group the out-of-memory killer ended."""
        path = self._paths["memory"]
        name = "memory.events" if self._version("memory") == 2 else "memory.oom_control"
        try:
            for line in (path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        """Remove the groups (after `kill`); a group still busy is retried briefly."""
        for path in self._versions:
            for _ in range(200):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        break
                    time.sleep(0.005)


def _write(path: Path, value: object, optional: bool = False) -> None:
    try:
        with open(path, "w", encoding="ascii") as fh:
            fh.write(str(value))
    except OSError:
        if not optional:
            raise
