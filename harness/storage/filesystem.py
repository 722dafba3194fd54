"""What the filesystem under a run directory may refuse: file locks and space.

Run directories are locked with `flock` (`rundir.py`, `claims.py`, `shards.running`). A
filesystem that refuses it (NFS without a lock daemon: ENOLCK; Lustre mounted `noflock`, some
FUSE filesystems: ENOSYS or EOPNOTSUPP) is one line naming the filesystem, from
/proc/self/mountinfo, and what would work (`LocksUnsupported`); the lock file the attempt made
is removed. A full disk (ENOSPC, or a quota: EDQUOT) is one line too (`DiskFull`), and so is a
file grown past the process's file size limit (`ulimit -f`: EFBIG): the records written before
it are kept, and the same command resumes once there is room. `append_whole` appends to a file
that must end with whole lines, so a write that fails half-way is cut off again.

A file replaced whole is written to `.NAME.PID.tmp` beside it first (`temporary_name`); a
process killed mid-write (SIGKILL, a power cut) leaves that file, which the next process to
hold the run directory, or its share, removes (`remove_temporaries`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dllmbench.core.errors import UserError

NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}
NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
MOUNTINFO = Path("/proc/self/mountinfo")


class LocksUnsupported(UserError):
    """The filesystem of a run directory refuses file locks."""


class DiskFull(UserError):
    """A write into a run directory found no space."""


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are written in octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mount_of(path: Path, mountinfo: Path = MOUNTINFO) -> tuple[str, str, str] | None:
    """The filesystem type, mount point and source of the mount that holds `path`, from
    mountinfo; None where there is none (not Linux)."""
    where, missing = Path(os.path.abspath(path)), []
    while not where.exists() and where != where.parent:  # links resolved where they exist
        where, missing = where.parent, [where.name, *missing]
    where = where.resolve().joinpath(*missing)
    try:
        lines = mountinfo.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    best: tuple[str, str, str] | None = None
    for line in lines:
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        point = _unescape(fields[4])
        kind = fields[dash + 1] if dash + 1 < len(fields) else "?"
        source = _unescape(fields[dash + 2]) if dash + 2 < len(fields) else ""
        inside = where == Path(point) or Path(point) in where.parents
        if inside and (best is None or len(point) >= len(best[1])):
            best = (kind, point, source)
    return best


def describe(path: Path) -> str:
    """`path`'s filesystem in words: `nfs4 (server:/export mounted at /mnt/runs)`."""
    mount = mount_of(path)
    if mount is None:
        return "a filesystem"
    kind, point, source = mount
    return f"{kind} ({source} mounted at {point})" if source else f"{kind} (at {point})"


def locks_unsupported(path: Path, exc: OSError) -> LocksUnsupported:
    """The line for a run directory `path` whose filesystem refused `flock` with `exc`."""
    return LocksUnsupported(
        f"run directory {path} is on {describe(path)}, which refuses file locks (flock: "
        f"{exc.strerror or os.strerror(exc.errno or 0)}); mount it with locks (NFS: a running "
        "lock daemon, no 'nolock'; Lustre: -o flock; BeeGFS: tuneUseGlobalFileLocks) or use a "
        "run directory on a filesystem that has them (docs/scaling.md, Shared filesystems)"
    )


def flock(fd: int, mode: int, path: Path) -> None:
    """`fcntl.flock`, with a filesystem that refuses locks one line (`LocksUnsupported`) naming
    the run directory `path`; BlockingIOError (held by another process) passes as it is."""
    try:
        fcntl.flock(fd, mode)
    except BlockingIOError:
        raise
    except OSError as exc:
        if exc.errno in NO_LOCKS:
            raise locks_unsupported(path, exc) from None
        raise


def disk_full(path: Path, exc: OSError) -> DiskFull:
    """The line for a write to `path` (a file of a run directory) that found no space."""
    folder = path.parent
    if exc.errno == errno.EFBIG:
        return DiskFull(
            f"cannot write {path}: it would pass the largest file this process may write "
            f"({exc.strerror}: the file size limit, `ulimit -f`, or the filesystem's); the "
            f"records written so far are kept in {folder}: raise the limit and run the same "
            "command again to resume"
        )
    return DiskFull(
        f"no space left on {describe(folder)} writing {path} ({exc.strerror}); the records "
        f"written so far are kept in {folder}: free space (or raise the quota) and run the "
        "same command again to resume"
    )


@contextmanager
def space_checked(path: Path) -> Iterator[None]:
    """Around a write to `path`: a full disk or quota is one line (`DiskFull`)."""
    try:
        yield
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise disk_full(path, exc) from None
        raise


def append_whole(path: Path, data: bytes) -> None:
    """Append `data` to `path` (made if missing) and fsync it; a write that fails (a full
    disk, the file size limit: `DiskFull`, one line) is cut off again, so the file ends as it
    did. Unbuffered: a buffered file writes what its buffer holds once more when it is cut or
    closed, and fails again there, leaving a torn line."""
    with space_checked(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # as open()
        try:
            size = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    if written == 0:  # no progress: as a full disk
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    view = view[written:]
                os.fsync(fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)  # truncating needs no space
                raise
        finally:
            os.close(fd)


TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp$")


def temporary_name(path: Path) -> Path:
    """The temporary file of this process's atomic write of `path`: `.NAME.PID.tmp`."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def remove_temporaries(folder: Path, owned: Callable[[str], bool] = lambda name: True) -> None:
    """Remove the temporary files (`temporary_name`) that other processes left in `folder`
    when they were killed mid-write, for the files `owned` names (by name): files only the
    caller may write now, since it holds their lock, so no other process is writing them.
    This process's own are left alone; one that cannot be removed stays."""
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except OSError:
        return
    for name in names:
        found = TEMPORARY.match(name)
        if found is None or int(found["pid"]) == os.getpid() or not owned(found["name"]):
            continue
        with contextlib.suppress(OSError):
            os.unlink(folder / name)
