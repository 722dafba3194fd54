"""The sandbox's child side: build the isolation, then run the program's steps.

Not imported by the harness: `dllmbench.tasks.sandbox` passes this file's source to a fresh
interpreter (`python -S -s -B -c SOURCE`, clean environment) and writes one request on its
stdin, in marshal format (the same interpreter reads it; json would cost an import). Standard
library only, so it runs the same in any interpreter.

With isolation "namespaces" the process unshares mount, network, PID, IPC and UTS namespaces
(and a user namespace when not root) and forks the PID namespace's init, which

1. builds a new root on a size-capped tmpfs holding read-only binds of the system directories
   (/usr, /bin, /lib*, /etc) and of the interpreter's own directories, a private /tmp, a scratch
   directory, a minimal /dev and a /proc that shows only the sandbox, then pivots into it and
   detaches the old root: nothing else of the host's file system is visible;
2. forks the program's process, which drops privileges (as root to a fresh unprivileged uid,
   otherwise by clearing every capability of the user namespace; no_new_privs either way),
   sets the resource limits, reports "ready" on the status pipe and closes it, and
3. installs an audit hook that refuses sockets, new processes and signals, and runs each step.

Isolation "process" has none of the namespaces, the new root or the privilege drop: the
process sets the limits and runs the program itself, in a scratch directory the grader made.
A run that completes writes the request's nonce on stdout and exits 0; anything else fails.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import select
import signal
import sys
import types

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME = 32, 1024, 2048
MS_BIND, MS_MOVE, MS_REC = 4096, 8192, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
MNT_DETACH = 2
# statvfs f_flag bits → mount flags (a bind remount must keep the flags the source has)
ST_TO_MS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME}
ST_TO_MS.update({2048: MS_NODIRATIME, 4096: MS_RELATIME})

PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
NEWROOT = "/tmp"  # mount point of the new root, in the private mount namespace only
SCRATCH = "/scratch"

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """The sandbox could not be built; reported on the status pipe, never to the program."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = ""):
    _check(
        libc.mount(
            None if source is None else source.encode(),
            target.encode(),
            None if fstype is None else fstype.encode(),
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source or fstype} on {target}",
    )


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


# -- the new root ----------------------------------------------------------------------------


def _binds() -> list[tuple[str, int]]:
    """(path, O_PATH fd) of every directory to show read-only: system and interpreter."""
    wanted = [d for d in SYSTEM_DIRS if os.path.lexists(d)]
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for prefix in prefixes:
        if os.path.isdir(prefix):
            wanted += [os.path.abspath(prefix), os.path.realpath(prefix)]
    out, seen = [], []
    for path in sorted(set(wanted), key=len):
        if any(path == s or path.startswith(s.rstrip("/") + "/") for s in seen):
            continue  # already visible through a parent bind
        seen.append(path)
        out.append((path, os.open(path, os.O_PATH)))
    return out


def _build_root(request: dict, owner: int) -> None:
    root = NEWROOT
    size = int(request["tmpfs_mb"])
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
    binds = _binds()  # opened in this mount namespace, before anything hides them
    flags = MS_NOSUID | MS_NODEV
    _mount("tmpfs", root, "tmpfs", flags, "size=1m,mode=755")
    for path, fd in binds:
        target = root + path
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            os.symlink(os.readlink(path), target)
            os.close(fd)
            continue
        os.makedirs(target, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        kept = sum(ms for st, ms in ST_TO_MS.items() if os.statvfs(target).f_flag & st)
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | kept)
        os.close(fd)
    os.makedirs(root + "/dev")
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            open(root + "/dev/" + name, "w").close()
            _mount("/dev/" + name, root + "/dev/" + name, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, root + "/dev/" + name)
    os.symlink("/proc/self/fd/1", root + "/dev/stdout")
    os.symlink("/proc/self/fd/2", root + "/dev/stderr")
    # the only writable places: the scratch directory and /tmp, each its own capped tmpfs
    os.makedirs(root + SCRATCH)
    opts = f"size={size}m,nr_inodes=4096"
    _mount("tmpfs", root + SCRATCH, "tmpfs", flags, f"{opts},mode=700,uid={owner},gid={owner}")
    os.makedirs(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", flags, f"{opts},mode=1777")
    os.makedirs(root + "/var", exist_ok=True)
    for link in ("/dev/shm", "/var/tmp"):
        if not os.path.lexists(root + link):
            os.symlink("/tmp", root + link)
    os.makedirs(root + "/proc")
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _pivot(root)


def _pivot(root: str) -> None:
    old = root + "/.oldroot"
    os.makedirs(old)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:  # no pivot_root number known: move the new root over / instead
        os.chdir(root)
        _mount(root, "/", None, MS_MOVE)
        os.chroot(".")
        os.chdir("/")
        return
    _check(libc.syscall(number, root.encode(), old.encode()), "pivot_root")
    os.chdir("/")
    _check(libc.umount2(b"/.oldroot", MNT_DETACH), "umount old root")
    os.rmdir("/.oldroot")
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _drop_privileges(uid: int | None) -> None:
    """Root: become `uid` (loses every capability). User namespace: clear all capabilities."""
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        return
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), data), "capset")


def _set_limits(request: dict) -> None:
    mb = 1024 * 1024
    limits = {
        resource.RLIMIT_AS: int(request["memory_mb"]) * mb,
        resource.RLIMIT_CPU: int(request["cpu_seconds"]),
        resource.RLIMIT_FSIZE: int(request["file_mb"]) * mb,
        resource.RLIMIT_NPROC: int(request["processes"]),
        resource.RLIMIT_NOFILE: int(request["open_files"]),
        resource.RLIMIT_CORE: 0,
    }
    for which, value in limits.items():
        _soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


# -- values returned to the grader ---------------------------------------------------------
# An "eval" step's value leaves the process as data, never as an object: exact builtin types
# only (no subclasses, no user classes; a dict subclass such as Counter is read as the plain
# dict it stores, through dict's own methods), recursively, as a tagged Python literal that the
# grader parses with `ast.literal_eval` and rebuilds itself. The grader, not this process,
# compares it with the expected value, so a program that patches this encoder can only make it
# emit some other value or garbage: never make a wrong value compare equal.

MAX_DEPTH = 40


def _encode(
    value,
    depth=0,
    _type=type,
    _repr=str.__repr__,
    _brepr=bytes.__repr__,
    _hex=float.hex,
    _isinstance=isinstance,
    _items=dict.items,
):
    """The value as a tagged literal; a TypeError for anything but exact builtin types (and
    dict subclasses, read through dict's own methods: their overrides never run)."""
    if depth > MAX_DEPTH:
        raise ValueError("the value is nested too deeply to return")
    kind = _type(value)
    if value is None:
        return "('N',)"
    if kind is bool:
        return "('b',1)" if value else "('b',0)"
    if kind is int:
        return "('i','" + ("-" if value < 0 else "") + _hex_int(value) + "')"
    if kind is float:
        return "('f','" + _hex(value) + "')"
    if kind is complex:
        return "('c','" + _hex(value.real) + "','" + _hex(value.imag) + "')"
    if kind is str:
        return "('s'," + _repr(value) + ")"
    if kind is bytes:
        return "('y'," + _brepr(value) + ")"
    tags = {list: "l", tuple: "t", set: "S", frozenset: "F"}
    if kind in tags:
        items = [_encode(v, depth + 1) + "," for v in value]
        return "('" + tags[kind] + "',(" + "".join(items) + "))"
    if _isinstance(value, dict):  # Counter, defaultdict…: their stored items, as a plain dict
        pairs = [
            "(" + _encode(k, depth + 1) + "," + _encode(v, depth + 1) + "),"
            for k, v in _items(value)
        ]
        return "('d',(" + "".join(pairs) + "))"
    raise TypeError(f"the sandbox returns only builtin values, not {kind.__name__}")


def _hex_int(value, _format=format):
    return "0x" + _format(-value if value < 0 else value, "x")


def _emit(fd, text, _write=os.write, _len=len):
    data = text.encode("utf-8", "surrogatepass")
    data = b"%d\n" % _len(data) + data
    while data:
        data = data[_write(fd, data) :]


# -- the guard and the program ---------------------------------------------------------------

REFUSED = frozenset(
    {
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "subprocess.Popen",
        "pty.spawn",
    }
)


def _guard(event: str, args: tuple) -> None:
    if event in REFUSED or event.startswith("socket."):
        raise PermissionError(f"the sandbox refuses {event}")


def _compile(steps: list) -> list:
    """(code, is_eval) of every step: each must compile before any runs."""
    out = []
    for step in steps:
        name, source = step[0], step[1]
        is_eval = len(step) > 2 and step[2] == "eval"
        out.append((compile(source, f"<{name}>", "eval" if is_eval else "exec"), is_eval))
    return out


def _finish(request: dict) -> None:
    """Run the steps; exit 0 with the nonce only if every one completed.

    What the program could patch is bound here first (exec, eval, os.write, os._exit, the
    encoder), and the request is emptied: the steps, the nonce and the values' descriptor live
    only in this frame's locals.
    """
    _exec, _eval, _exit, _write, _encode_, _emit_ = exec, eval, os._exit, os.write, _encode, _emit
    marker = f"\n{request.pop('nonce')}\n".encode()
    values = int(request.pop("values_fd"))
    steps = request.pop("steps")
    request.clear()
    try:
        codes = _compile(steps)
        del steps
        module = types.ModuleType("__sandbox__")
        sys.modules["__sandbox__"] = module
        namespace = module.__dict__
        sys.addaudithook(_guard)  # cannot be removed once added
        for code, is_eval in codes:
            if is_eval:
                _emit_(values, _encode_(_eval(code, namespace)))
            else:
                _exec(code, namespace)
    except BaseException:  # SystemExit and KeyboardInterrupt are failures too
        try:
            import traceback

            sys.stdout.flush()
            sys.stderr.write(traceback.format_exc(limit=-3)[-2000:])
            sys.stderr.flush()
        except BaseException:
            pass
        _exit(1)
    try:  # noqa: SIM105 - contextlib would be one more import at every start
        sys.stdout.flush()
    except BaseException:
        pass
    _write(1, marker)
    _exit(0)  # no atexit handlers, no lingering threads


def _report(fd: int, message: str) -> None:
    os.write(fd, message.encode()[:4000] + b"\n")
    os.close(fd)


# -- entry points ----------------------------------------------------------------------------


def _exit_code(wait_status: int) -> int:
    code = os.waitstatus_to_exitcode(wait_status)
    return code if code >= 0 else 128 - code


def _inner(request: dict, status: int, alive: int, uid: int | None) -> None:
    """PID 1 of the new namespace: build the root, then run the program as PID 2.

    The program is not PID 1 so that signals act on it as usual (a PID 1 ignores the ones it
    sends itself); PID 1 only waits, reaps orphans and passes the program's status on.
    """
    try:
        _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
        if select.select([alive], [], [], 0)[0]:  # the outer process is already gone
            os._exit(1)
        os.close(alive)
        _build_root(request, uid if uid is not None else 0)
        program = os.fork()
    except (SetupError, OSError) as exc:
        _report(status, f"error: {exc}")
        os._exit(1)
    if program == 0:
        try:
            _set_limits(request)
            _drop_privileges(uid)
            _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
            os.chdir(SCRATCH)
            os.environ.update(HOME=SCRATCH, TMPDIR="/tmp")
        except (SetupError, OSError) as exc:
            _report(status, f"error: {exc}")
            os._exit(1)
        _report(status, "ready")
        _finish(request)
    os.close(status)
    while True:
        pid, wait_status = os.wait()
        if pid == program:
            os._exit(_exit_code(wait_status))


def _namespaces(request: dict, status: int) -> None:
    """Unshare, fork PID 1 and relay its exit status."""
    root = os.geteuid() == 0
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    euid, egid = os.geteuid(), os.getegid()
    try:
        _check(libc.unshare(flags if root else flags | CLONE_NEWUSER), "unshare")
        if not root:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"0 {euid} 1")
            _write("/proc/self/gid_map", f"0 {egid} 1")
    except (SetupError, OSError) as exc:
        _report(status, f"error: {exc}")
        os._exit(1)
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        _inner(request, status, alive_r, int(request["uid"]) if root else None)
        os._exit(1)
    os.close(status)
    os.close(alive_r)
    _pid, wait_status = os.waitpid(pid, 0)
    os._exit(_exit_code(wait_status))


def _process(request: dict, status: int) -> None:
    """No namespaces: limits and the guard only, in the scratch directory given as cwd."""
    try:
        _set_limits(request)
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    except (SetupError, OSError, ValueError) as exc:
        _report(status, f"error: {exc}")
        os._exit(1)
    _report(status, "ready")
    _finish(request)


def _site_packages() -> None:
    """Started with -S (no .pth files run: they cost tens of ms and run arbitrary code), so
    add the site-packages folders to the path by hand; user site stays off."""
    import site

    for path in site.getsitepackages():
        if os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)


def main() -> None:
    if "" in sys.path:
        sys.path.remove("")
    _site_packages()
    request = marshal.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    status = int(request["status_fd"])
    if request["isolation"] == "namespaces":
        _namespaces(request, status)
    else:
        _process(request, status)


if __name__ == "__main__":
    main()
