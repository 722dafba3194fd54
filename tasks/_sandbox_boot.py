"""The sandbox's child side: build the isolation, then run the program's steps.

Not imported by the harness: `dllmbench.tasks.sandbox` passes this file's source to a fresh
interpreter (`python -S -s -B -c SOURCE`, clean environment) and writes one request on its
stdin, in marshal format (the same interpreter reads it; json would cost an import). Standard
library only, so it runs the same in any interpreter.

With isolation "namespaces" the process unshares mount, network, PID, IPC and UTS namespaces
(and a user namespace when not root) and forks the PID namespace's init, which

1. builds a new root on a size-capped tmpfs holding read-only binds of the system directories
   (/usr, /bin, /lib*) and of the interpreter's own directories, a minimal /etc, a private
   /tmp, a scratch directory, a minimal /dev and a /proc that shows only the sandbox, then
   pivots into it and detaches the old root: nothing else of the host's file system is
   visible;
2. forks the program's process, which drops privileges (as root to a fresh unprivileged uid,
   otherwise by clearing every capability of the user namespace; no_new_privs either way),
   sets the resource limits, installs the seccomp filter, reports "ready" on the status pipe
   and closes it, and
3. installs an audit hook that refuses sockets, new processes and signals, and runs each step.

Isolation "process" makes a mount namespace only (and a user namespace when not root): the
process builds the same new root (with an empty /proc: there is no PID namespace to show),
confines its file access with Landlock, sets the limits, drops privileges as in 2, installs the
seccomp filter and runs the program itself.
A run that completes writes the request's nonce on stdout and exits 0; anything else fails.
"""

from __future__ import annotations

import collections
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

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# of the host's /etc only what the dynamic loader and the time functions read
ETC_COPIED = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime")
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


def _binds(site_packages: list[str]) -> list[tuple[str, int]]:
    """(path, O_PATH fd) of every directory to show read-only: system and interpreter
    directories and the site-packages folders the grader names."""
    wanted = [d for d in SYSTEM_DIRS if os.path.lexists(d)]
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for prefix in (*prefixes, *site_packages):
        if os.path.isdir(prefix):
            wanted += [os.path.abspath(prefix), os.path.realpath(prefix)]
    out, seen = [], []
    for path in sorted(set(wanted), key=len):
        if any(path == s or path.startswith(s.rstrip("/") + "/") for s in seen):
            continue  # already visible through a parent bind
        seen.append(path)
        out.append((path, os.open(path, os.O_PATH)))
    return out


def _hide(root: str, binds: list[str], hidden: list[str]) -> None:
    """Cover each hidden path (real paths: the grader's package and data) that a bind shows,
    under every name the binds show it: a folder with an empty read-only tmpfs, a file with
    /dev/null."""
    for bind in binds:
        real = os.path.realpath(bind)
        for path in hidden:
            if path != real and not path.startswith(real.rstrip("/") + "/"):
                continue
            target = root + bind + path[len(real) :]
            if os.path.islink(target):
                continue
            if os.path.isdir(target):
                flags = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY
                _mount("tmpfs", target, "tmpfs", flags, "size=4k,nr_inodes=2,mode=000")
            elif os.path.isfile(target):  # a data file: read as empty
                _mount("/dev/null", target, None, MS_BIND)


def _build_root(request: dict, owner: int, group: int | None = None, procfs: bool = True) -> None:
    """Build the new root and pivot into it; the scratch folder owned by `owner` (and `group`,
    else `owner`); /proc a procfs of the PID namespace, or (`procfs` false: no PID namespace of
    its own) an empty read-only tmpfs."""
    group = owner if group is None else group
    root = NEWROOT
    size = int(request["tmpfs_mb"])
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
    binds = _binds(request["site_packages"])  # opened here, before anything hides them
    flags = MS_NOSUID | MS_NODEV
    _mount("tmpfs", root, "tmpfs", flags, "size=4m,mode=755")
    _minimal_etc(root + "/etc", owner)
    # the only writable places: the scratch directory and /tmp, each its own capped tmpfs (made
    # first: a bind below /tmp, such as a virtual environment there, goes on top of it)
    os.makedirs(root + SCRATCH)
    opts = f"size={size}m,nr_inodes=4096"
    _mount("tmpfs", root + SCRATCH, "tmpfs", flags, f"{opts},mode=700,uid={owner},gid={group}")
    os.makedirs(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", flags, f"{opts},mode=1777")
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
    _hide(root, [path for path, _fd in binds], request["hidden"])
    os.makedirs(root + "/dev", exist_ok=True)
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            open(root + "/dev/" + name, "w").close()
            _mount("/dev/" + name, root + "/dev/" + name, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, root + "/dev/" + name)
    os.symlink("/proc/self/fd/1", root + "/dev/stdout")
    os.symlink("/proc/self/fd/2", root + "/dev/stderr")
    os.makedirs(root + "/var", exist_ok=True)
    for link in ("/dev/shm", "/var/tmp"):
        if not os.path.lexists(root + link):
            os.symlink("/tmp", root + link)
    os.makedirs(root + "/proc", exist_ok=True)
    if procfs:
        _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    else:
        sealed = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        _mount("tmpfs", root + "/proc", "tmpfs", sealed, "size=4k,nr_inodes=1,mode=555")
    _pivot(root)


def _minimal_etc(etc: str, uid: int) -> None:
    """An /etc of a few files: the loader's cache and configuration and the time zone copied
    from the host, and users, groups and hosts of the sandbox's own."""
    os.makedirs(etc)
    for name in ETC_COPIED:
        source = "/etc/" + name
        if os.path.isdir(source):
            os.makedirs(etc + "/" + name)
            entries = sorted(os.listdir(source))
            files = [e for e in entries if os.path.isfile(os.path.join(source, e))]
            for entry in files:
                _copy(os.path.join(source, entry), f"{etc}/{name}/{entry}")
        elif os.path.isfile(source):
            _copy(source, etc + "/" + name)
    users = f"root:x:0:0:root:/:/bin/false\nsandbox:x:{uid}:{uid}:sandbox:/scratch:/bin/false\n"
    _write(etc + "/passwd", users if uid else users.splitlines()[0] + "\n")
    groups = f"root:x:0:\nsandbox:x:{uid}:\n"
    _write(etc + "/group", groups if uid else "root:x:0:\n")
    _write(etc + "/hosts", "127.0.0.1 localhost\n::1 localhost\n")


def _copy(source: str, target: str, cap: int = 1 << 20) -> None:
    with open(source, "rb") as fh:
        data = fh.read(cap)
    with open(target, "wb") as fh:
        fh.write(data)


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


# -- the seccomp filter ----------------------------------------------------------------------
# Installed in the program's process after the privilege drop, before any step runs; the kernel
# enforces it whatever the program does in Python, ctypes included. A denied call fails with
# EPERM (clone3 with ENOSYS, so that the C library falls back to clone, whose flags the filter
# can read); a call from another architecture's table kills the process.

SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO, SECCOMP_RET_ALLOW = 0x80000000, 0x50000, 0x7FFF0000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
LD_W_ABS, JEQ_K, JSET_K, JGE_K, RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
EPERM, ENOSYS = 1, 38
CLONE_THREAD, AF_UNIX = 0x00010000, 1
X32_SYSCALL_BIT = 0x40000000

# architecture → (AUDIT_ARCH value, {name: number}) of every call the filter looks at
SYSCALLS = {
    "x86_64": (
        0xC000003E,
        {
            "fork": 57,
            "vfork": 58,
            "clone": 56,
            "clone3": 435,
            "execve": 59,
            "execveat": 322,
            "socket": 41,
            "socketpair": 53,
            "prlimit64": 302,
            "setpriority": 141,
            "sched_setparam": 142,
            "sched_setscheduler": 144,
            "sched_setaffinity": 203,
            "sched_setattr": 314,
            "ioprio_set": 251,
            "migrate_pages": 256,
            "move_pages": 279,
            "fcntl": 72,
            "ioctl": 16,
            "kill": 62,
            "tkill": 200,
            "tgkill": 234,
            "rt_sigqueueinfo": 129,
            "rt_tgsigqueueinfo": 297,
            "pidfd_send_signal": 424,
            "pidfd_open": 434,
            "pidfd_getfd": 438,
            "unshare": 272,
            "setns": 308,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "process_madvise": 440,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "shmget": 29,
            "shmat": 30,
            "shmctl": 31,
            "shmdt": 67,
            "semget": 64,
            "semop": 65,
            "semctl": 66,
            "semtimedop": 220,
            "msgget": 68,
            "msgsnd": 69,
            "msgrcv": 70,
            "msgctl": 71,
            "memfd_create": 319,
            "memfd_secret": 447,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "personality": 135,
            "name_to_handle_at": 303,
            "open_by_handle_at": 304,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "reboot": 169,
            "swapon": 167,
            "swapoff": 168,
            "syslog": 103,
            "chmod": 90,
            "fchmod": 91,
            "fchmodat": 268,
            "fchmodat2": 452,
            "chown": 92,
            "fchown": 93,
            "lchown": 94,
            "fchownat": 260,
            "utime": 132,
            "utimes": 235,
            "futimesat": 261,
            "utimensat": 280,
            "setxattr": 188,
            "lsetxattr": 189,
            "fsetxattr": 190,
            "removexattr": 197,
            "lremovexattr": 198,
            "fremovexattr": 199,
            "setxattrat": 463,
            "removexattrat": 466,
            "mq_open": 240,
            "mq_unlink": 241,
            "mq_timedsend": 242,
            "mq_timedreceive": 243,
            "mq_notify": 244,
            "mq_getsetattr": 245,
            "flock": 73,
            "inotify_init": 253,
            "inotify_init1": 294,
            "inotify_add_watch": 254,
            "fanotify_init": 300,
            "fanotify_mark": 301,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "clone": 220,
            "clone3": 435,
            "execve": 221,
            "execveat": 281,
            "socket": 198,
            "socketpair": 199,
            "prlimit64": 261,
            "setpriority": 140,
            "sched_setparam": 118,
            "sched_setscheduler": 119,
            "sched_setaffinity": 122,
            "sched_setattr": 274,
            "ioprio_set": 30,
            "migrate_pages": 238,
            "move_pages": 239,
            "fcntl": 25,
            "ioctl": 29,
            "kill": 129,
            "tkill": 130,
            "tgkill": 131,
            "rt_sigqueueinfo": 138,
            "rt_tgsigqueueinfo": 240,
            "pidfd_send_signal": 424,
            "pidfd_open": 434,
            "pidfd_getfd": 438,
            "unshare": 97,
            "setns": 268,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "process_madvise": 440,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "shmget": 194,
            "shmctl": 195,
            "shmat": 196,
            "shmdt": 197,
            "semget": 190,
            "semctl": 191,
            "semtimedop": 192,
            "semop": 193,
            "msgget": 186,
            "msgctl": 187,
            "msgrcv": 188,
            "msgsnd": 189,
            "memfd_create": 279,
            "memfd_secret": 447,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "personality": 92,
            "name_to_handle_at": 264,
            "open_by_handle_at": 265,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "reboot": 142,
            "swapon": 224,
            "swapoff": 225,
            "syslog": 116,
            "fchmod": 52,
            "fchmodat": 53,
            "fchmodat2": 452,
            "fchown": 55,
            "fchownat": 54,
            "utimensat": 88,
            "setxattr": 5,
            "lsetxattr": 6,
            "fsetxattr": 7,
            "removexattr": 14,
            "lremovexattr": 15,
            "fremovexattr": 16,
            "setxattrat": 463,
            "removexattrat": 466,
            "mq_open": 180,
            "mq_unlink": 181,
            "mq_timedsend": 182,
            "mq_timedreceive": 183,
            "mq_notify": 184,
            "mq_getsetattr": 185,
            "flock": 32,
            "inotify_init1": 26,
            "inotify_add_watch": 27,
            "fanotify_init": 262,
            "fanotify_mark": 263,
        },
    ),
}
# calls allowed on a condition: (argument, test, value) — the own process as target, a thread
# rather than a process, a UNIX socket
SIGNALS_TO_SELF = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
# calls that change a process given by its pid (its limits, its scheduling, its priority, where
# its memory lies): the kernel lets a process change any other of its uid, and without a PID
# namespace the grader is one of them. Allowed on the program itself (pid 0 or its own) only:
# name → (the argument saying what kind of target and its value for one process, or None; the
# argument that holds the pid)
ON_ITSELF: dict[str, tuple[tuple[int, int] | None, int]] = {
    "prlimit64": (None, 0),
    "sched_setparam": (None, 0),
    "sched_setscheduler": (None, 0),
    "sched_setaffinity": (None, 0),
    "sched_setattr": (None, 0),
    "migrate_pages": (None, 0),
    "move_pages": (None, 0),
    "setpriority": ((0, 0), 1),  # PRIO_PROCESS, not a process group or a whole user
    "ioprio_set": ((0, 1), 1),  # IOPRIO_WHO_PROCESS
}
# fcntl commands that aim the descriptor's SIGIO (or any signal) at a process or group:
# F_SETOWN, F_SETSIG, F_SETOWN_EX; those that lock or lease a file a host process may use
# (F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE: a shown file locked blocks its
# host readers); and the ioctl forms of F_SETOWN (FIOSETOWN, SIOCSPGRP)
FCNTL_REFUSED = (8, 10, 15, 6, 7, 37, 38, 1024)
IOCTL_REFUSED = (0x8901, 0x8902)


class _Instruction(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    )


class _Program(ctypes.Structure):
    _fields_ = (("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Instruction)))


def _arg_low(index: int) -> int:
    """Offset in struct seccomp_data of the low 32 bits of argument `index` (little-endian)."""
    return 16 + 8 * index + (0 if sys.byteorder == "little" else 4)


def seccomp_program(
    machine: str, pid: int, unix_sockets: bool, threads: bool = True
) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions: every call in the table denied, except a
    clone that makes a thread (if `threads`), signals to `pid` itself, the calls of `ON_ITSELF`
    aimed at itself (pid 0 or `pid`), `fcntl` and `ioctl` but for the commands that aim
    signals at a process, and (if `unix_sockets`) UNIX sockets and socket pairs."""
    if machine not in SYSCALLS:
        raise SetupError(f"no seccomp filter for the {machine} architecture")
    arch, table = SYSCALLS[machine]
    deny = (RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM)
    allow = (RET_K, 0, 0, SECCOMP_RET_ALLOW)
    out = [(LD_W_ABS, 0, 0, 4), (JEQ_K, 1, 0, arch), (RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS)]
    out.append((LD_W_ABS, 0, 0, 0))  # the call's number
    if machine == "x86_64":  # the x32 table: refused whole
        out += [(JGE_K, 0, 1, X32_SYSCALL_BIT), deny]
    for name, number in table.items():
        if name == "clone3":
            body = [(RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS)]
        elif name == "clone" and threads:
            body = [(LD_W_ABS, 0, 0, _arg_low(0)), (JSET_K, 0, 1, CLONE_THREAD), allow, deny]
        elif name in ("socket", "socketpair") and unix_sockets:
            body = [(LD_W_ABS, 0, 0, _arg_low(0)), (JEQ_K, 0, 1, AF_UNIX), allow, deny]
        elif name in SIGNALS_TO_SELF:
            body = [(LD_W_ABS, 0, 0, _arg_low(0)), (JEQ_K, 0, 1, pid), allow, deny]
        elif name in ON_ITSELF:
            kind, who = ON_ITSELF[name]
            target = [(LD_W_ABS, 0, 0, _arg_low(who)), (JEQ_K, 1, 0, 0), (JEQ_K, 0, 1, pid), allow]
            body = []
            if kind is not None:  # another kind of target: on to the deny after `target`
                body += [(LD_W_ABS, 0, 0, _arg_low(kind[0])), (JEQ_K, 0, len(target), kind[1])]
            body += [*target, deny]
        elif name in ("fcntl", "ioctl"):
            refused = FCNTL_REFUSED if name == "fcntl" else IOCTL_REFUSED
            body = [(LD_W_ABS, 0, 0, _arg_low(1))]
            body += [(JEQ_K, len(refused) - i, 0, cmd) for i, cmd in enumerate(refused)]
            body += [allow, deny]
        else:
            body = [deny]
        out += [(JEQ_K, 0, len(body), number), *body]
    out.append(allow)
    return out


def _install_seccomp(unix_sockets: bool, threads: bool) -> None:
    program = seccomp_program(os.uname().machine, os.getpid(), unix_sockets, threads)
    instructions = (_Instruction * len(program))(*program)
    fprog = _Program(len(program), instructions)
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


# -- Landlock (isolation "process" only) -------------------------------------------------------
# Without namespaces the program sees the host's file system; Landlock (Linux 5.13+) confines
# it: read and execute in the system and interpreter directories and the site-packages the
# grader names (less the paths it hides: its own package and data), read and write in its
# scratch directory and a few devices, nothing else. Required in this mode. From ABI 4 TCP
# bind and connect are refused too, and from ABI 6 signals and abstract UNIX sockets are scoped
# to the program (the seccomp filter refuses both as well).

SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 2, 4, 8
FS_FILE_RIGHTS = {1: 1 | 2 | 4, 3: 1 | 2 | 4 | (1 << 14), 5: 1 | 2 | 4 | (1 << 14) | (1 << 15)}
FS_ALL = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
NET_TCP_ALL = 1 | 2  # LANDLOCK_ACCESS_NET_BIND_TCP, _CONNECT_TCP (ABI 4)
SCOPE_ALL = 1 | 2  # LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET, LANDLOCK_SCOPE_SIGNAL (ABI 6)


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def _landlock_abi() -> int:
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(0, abi)


def _beneath(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def _read_rules(path: str, hidden: list[str], read: int) -> list[tuple[str, int]]:
    """Rules that give `read` beneath `path` except beneath any of `hidden`: where a hidden path
    lies inside, the directory itself may be listed and each entry is given on its own, down
    the way to the hidden one (whose entries stay unreadable)."""
    inside = [h for h in hidden if _beneath(h, path)]
    if not inside:
        return [(path, read)]
    if any(h == path for h in inside) or not os.path.isdir(path) or os.path.islink(path):
        return []
    out = [(path, FS_READ_DIR)]
    for entry in sorted(os.listdir(path)):
        full = os.path.join(path, entry)
        if not os.path.islink(full):  # a link is followed to a target with its own rules
            out += _read_rules(full, inside, read)
    return out


def _landlock(writable: list[str], site_packages: list[str], hidden: list[str]) -> bool:
    """Confine the file system access of this process (and the threads it makes after); False
    where the kernel has no Landlock."""
    abi = _landlock_abi()
    if abi < 1:
        return False
    level = max(k for k in FS_ALL if k <= abi)
    handled, file_rights = FS_ALL[level], FS_FILE_RIGHTS[max(k for k in FS_FILE_RIGHTS if k <= abi)]
    attr = _RulesetAttr(handled, NET_TCP_ALL if abi >= 4 else 0, SCOPE_ALL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise SetupError(f"landlock: {os.strerror(ctypes.get_errno())}")
    read = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    rules = []
    for path, _fd in _close_all(_binds(site_packages)):
        rules += _read_rules(path, hidden, read)
    rules += [("/etc/" + name, read) for name in ETC_COPIED]
    rules += [("/dev/" + name, FS_READ_FILE | FS_WRITE_FILE) for name in DEVICES]
    rules += [(folder, handled) for folder in writable]
    try:
        for path, rights in rules:
            if not os.path.exists(path):
                continue
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                allowed = rights & (handled if os.path.isdir(path) else file_rights)
                rule = _PathBeneath(allowed, fd)
                rc = libc.syscall(
                    SYS_LANDLOCK_ADD_RULE,
                    ruleset,
                    LANDLOCK_RULE_PATH_BENEATH,
                    ctypes.byref(rule),
                    0,
                )
                _check(0 if rc == 0 else -1, f"landlock rule for {path}")
            finally:
                os.close(fd)
        _check(libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock")
    finally:
        os.close(ruleset)
    return True


def _close_all(binds: list[tuple[str, int]]) -> list[tuple[str, int]]:
    for _path, fd in binds:
        os.close(fd)
    return binds


# -- values returned to the grader ---------------------------------------------------------
# An "eval" step's value leaves the process as data, never as an object: builtin values,
# recursively, as a tagged Python literal that the grader parses with `ast.literal_eval` and
# rebuilds itself. The grader, not this process, compares it with the expected value, so a
# program that patches this encoder can only make it emit some other value or garbage: never
# make a wrong value compare equal. What is read, and how:
#
# - exact builtin types as they are;
# - subclasses of the builtin types (a namedtuple, an int subclass, Counter, OrderedDict…)
#   through their base type's own methods, so their overrides never run; but a class that
#   defines its own equality or truth (`__eq__`, `__ne__`, `__bool__`, `__len__`; the standard
#   library's Counter, OrderedDict and collections.User* excepted) is refused: Python's own
#   assert would have used it, and the grader cannot;
# - collections.UserList, UserDict, UserString: the value they hold (`data`);
# - fractions.Fraction and decimal.Decimal as exact numbers (they compare as numbers);
# - numpy scalars as numpy scalars of their dtype (so `is True` fails for `numpy.True_`, as
#   Python's own assert fails it), and numpy arrays of numbers as arrays (dtype, shape, items:
#   a one-element array compares equal to its number, a longer one cannot be asserted equal);
# - dict views (`keys()`, `values()`, `items()`) as views (keys and items compare as sets);
# - an iterator (`map`, `filter`, a generator…) as the items it gives, rebuilt as an iterator
#   over them (so `tuple(f(x))` sees them, and `f(x) == [...]` is false, as in Python).

MAX_DEPTH = 40
OWN_SEMANTICS = ("__eq__", "__ne__", "__bool__", "__len__")
_BUILTIN_BASES = (bool, int, float, complex, str, bytes, list, tuple, set, frozenset, dict)
_TRUSTED = (
    collections.Counter,
    collections.OrderedDict,
    collections.UserList,
    collections.UserDict,
    collections.UserString,
    collections.defaultdict,
    collections.deque,
)
_WRAPPERS = (collections.UserList, collections.UserDict, collections.UserString)
_class_dict = type.__dict__["__dict__"].__get__
_class_mro = type.__dict__["__mro__"].__get__
_get = object.__getattribute__
_hasattr = hasattr


def _base_of(kind):
    """The builtin type a value of `kind` is read as, or None; a TypeError for a class with
    equality or truth of its own."""
    for cls in _class_mro(kind):
        if cls in _BUILTIN_BASES or cls in _TRUSTED:
            return cls
        if cls is object:
            return None
        if any(name in _class_dict(cls) for name in OWN_SEMANTICS):
            raise TypeError(
                f"the sandbox does not return a {kind.__name__}: its class defines its own "
                "equality or truth, which the grader cannot use"
            )
    return None


def _module_class(module: str, name: str):
    found = sys.modules.get(module)
    return getattr(found, name, None) if found is not None else None


def _encode(
    value,
    depth=0,
    _type=type,
    _repr=str.__repr__,
    _brepr=bytes.__repr__,
    _hex=float.hex,
    _isinstance=isinstance,
    _items=dict.items,
    _index=int.__index__,
    _real=complex.real.__get__,
    _imag=complex.imag.__get__,
):
    """The value as a tagged literal (see above); a TypeError for anything else."""
    if depth > MAX_DEPTH:
        raise ValueError("the value is nested too deeply to return")
    kind = _type(value)
    if value is None:
        return "('N',)"
    if kind is bool:
        return "('b',1)" if value else "('b',0)"
    if kind is int:
        return "('i','" + _hex_int(value) + "')"
    if kind is float:
        return "('f','" + _hex(value) + "')"
    if kind is str:
        return "('s'," + _repr(value) + ")"
    tags = {list: "l", tuple: "t", set: "S", frozenset: "F"}
    if kind in tags:
        items = [_encode(v, depth + 1) + "," for v in value]
        return "('" + tags[kind] + "',(" + "".join(items) + "))"
    view = _VIEWS.get(kind)
    if view is not None:
        items = [_encode(v, depth + 1) + "," for v in value]
        return "('" + view + "',(" + "".join(items) + "))"
    numbers = _numbers(value, kind)
    if numbers is not None:
        return numbers
    base = _base_of(kind)
    if base in _WRAPPERS:
        return _encode(_get(value, "data"), depth + 1)
    if base is None and _hasattr(kind, "__next__"):  # map, a generator…: the items it gives
        items = [_encode(v, depth + 1) + "," for v in value]
        return "('it',(" + "".join(items) + "))"
    if base is None:
        raise TypeError(f"the sandbox returns only builtin values, not {kind.__name__}")
    if base is int:
        return "('i','" + _hex_int(_index(value)) + "')"
    if base is float:
        return "('f','" + _hex(value) + "')"
    if base is complex:
        return "('c','" + _hex(_real(value)) + "','" + _hex(_imag(value)) + "')"
    if base is str:
        return "('s'," + _repr(value) + ")"
    if base is bytes:
        return "('y'," + _brepr(value) + ")"
    for sequence, tag in ((list, "l"), (tuple, "t"), (set, "S"), (frozenset, "F")):
        if base is sequence or _isinstance(value, sequence):
            items = [_encode(v, depth + 1) + "," for v in sequence.__iter__(value)]
            return "('" + tag + "',(" + "".join(items) + "))"
    if _isinstance(value, dict):  # Counter, defaultdict…: their stored items, as a plain dict
        pairs = [
            "(" + _encode(k, depth + 1) + "," + _encode(v, depth + 1) + "),"
            for k, v in _items(value)
        ]
        return "('d',(" + "".join(pairs) + "))"
    if base is collections.deque:
        items = [_encode(v, depth + 1) + "," for v in collections.deque.__iter__(value)]
        return "('Q',(" + "".join(items) + "))"
    raise TypeError(f"the sandbox returns only builtin values, not {kind.__name__}")


_VIEWS = {type({}.keys()): "K", type({}.values()): "V", type({}.items()): "I"}


def _numbers(value, kind, _index=int.__index__, _str=str.__str__, _repr=str.__repr__):
    """A Fraction, Decimal, numpy scalar or array as a tagged literal; None for others."""
    fraction = _module_class("fractions", "Fraction")
    if fraction is not None and isinstance(value, fraction):
        top, bottom = _index(value.numerator), _index(value.denominator)
        return "('q','" + _hex_int(top) + "','" + _hex_int(bottom) + "')"
    decimal = _module_class("decimal", "Decimal")
    if decimal is not None and isinstance(value, decimal):
        return "('D'," + _repr(_str(decimal.__str__(value))) + ")"
    generic = _module_class("numpy", "generic")
    array = _module_class("numpy", "ndarray")
    scalar = generic is not None and isinstance(value, generic)
    if not (scalar or (array is not None and isinstance(value, array))):
        return None
    dtype = value.dtype
    if dtype.kind not in "biufc":
        raise TypeError(f"the sandbox does not return a numpy {kind.__name__} of {dtype}")
    if scalar:
        return "('n'," + _repr(dtype.str) + "," + _encode(value.item()) + ")"
    items = [_encode(v) + "," for v in value.ravel().tolist()]
    shape = _encode(tuple(int(n) for n in value.shape))
    return "('A'," + _repr(dtype.str) + "," + shape + ",(" + "".join(items) + "))"


def _hex_int(value, _format=format):
    return ("-" if value < 0 else "") + "0x" + _format(-value if value < 0 else value, "x")


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
    """(code, kind, function) of every step: each must compile before any runs. Kinds: "exec",
    "eval" (the value is sent back), "serve" (answer calls of the program's `function` until
    the calls' end; the source is empty) and "ask" (run with `__candidate__` asking the other
    side of a conversation)."""
    out = []
    for step in steps:
        name, source = step[0], step[1]
        kind = step[2] if len(step) > 2 else "exec"
        function = step[3] if kind == "serve" else None
        mode = "eval" if kind == "eval" else "exec"
        out.append((compile(source, f"<{name}>", mode), kind, function))
    return out


# -- a conversation ---------------------------------------------------------------------------
# A "serve" step answers calls of the program's function: each record read on the calls
# descriptor holds a call's arguments (`(args, kwargs)`, encoded as above), each answer written
# on the values descriptor the value the function returned. An "ask" step is the other side,
# in a run that holds no program: its `__candidate__` sends each call's arguments and returns
# the value the answer holds. The grader carries records between the two and checks each.


def _receive(fd, _read=os.read):
    """The next record on `fd` (`<length>\n<bytes>`), or None at its end."""
    head = b""
    while not head.endswith(b"\n"):
        byte = _read(fd, 1)
        if not byte or len(head) > 12:
            return None
        head += byte
    size, data = int(head), b""
    while len(data) < size:
        chunk = _read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data.decode("utf-8", "surrogatepass")


def _rebuild(node):
    """The value of a tagged literal (the grader checked it with its strict decoder first)."""
    tag, args = node[0], node[1:]
    if tag == "N":
        return None
    if tag == "b":
        return bool(args[0])
    if tag == "i":
        return int(args[0], 16)
    if tag == "f":
        return float.fromhex(args[0])
    if tag == "c":
        return complex(float.fromhex(args[0]), float.fromhex(args[1]))
    if tag in ("s", "y"):
        return args[0]
    if tag == "q":
        return __import__("fractions").Fraction(int(args[0], 16), int(args[1], 16))
    if tag == "D":
        return __import__("decimal").Decimal(args[0])
    if tag == "d":
        return {_rebuild(k): _rebuild(v) for k, v in args[0]}
    if tag == "n":
        return __import__("numpy").dtype(args[0]).type(_rebuild(args[1]))
    if tag == "A":
        items = [_rebuild(item) for item in args[2]]
        return __import__("numpy").array(items, dtype=args[0]).reshape(_rebuild(args[1]))
    items = [_rebuild(item) for item in args[0]]
    if tag == "K":
        return dict.fromkeys(items).keys()
    if tag == "V":
        return dict(enumerate(items)).values()
    if tag == "I":
        return dict(items).items()
    if tag == "it":
        return iter(items)
    kinds = {"l": list, "t": tuple, "S": set, "F": frozenset, "Q": collections.deque}
    return kinds[tag](items)


def _serve(function, calls, values, _emit_, _encode_):
    """Answer each call that arrives on `calls` until its end."""
    import ast

    while True:
        record = _receive(calls)
        if record is None:
            return
        args, kwargs = _rebuild(ast.literal_eval(record))
        _emit_(values, _encode_(function(*args, **kwargs)))


def _asker(calls, values):
    """A stand-in for the program's function, in a run without it: each call's arguments go
    out as data, the value the program's function returned comes back as data."""
    import ast

    def candidate(*args, **kwargs):
        _emit(values, _encode((args, kwargs)))
        record = _receive(calls)
        if record is None:
            raise AssertionError("the program gave no answer to a call of its function")
        return _rebuild(ast.literal_eval(record))

    return candidate


def _finish(request: dict) -> None:
    """Run the steps; exit 0 with the nonce only if every one completed.

    What the program could patch is bound here first (exec, eval, os.write, os._exit, the
    encoder), and the request is emptied: the steps, the nonce and the values' descriptor live
    only in this frame's locals.
    """
    _exec, _eval, _exit, _write, _encode_, _emit_ = exec, eval, os._exit, os.write, _encode, _emit
    _serve_, _asker_ = _serve, _asker
    marker = f"\n{request.pop('nonce')}\n".encode()
    values = int(request.pop("values_fd"))
    calls = request.pop("calls_fd", None)
    steps = request.pop("steps")
    request.clear()
    namespace: dict = {}
    try:
        codes = _compile(steps)
        del steps
        module = types.ModuleType("__sandbox__")
        sys.modules["__sandbox__"] = module
        namespace = module.__dict__
        sys.addaudithook(_guard)  # cannot be removed once added
        for code, kind, function in codes:
            if kind == "eval":
                _emit_(values, _encode_(_eval(code, namespace)))
                continue
            if kind == "serve":  # without a conversation: no calls to answer
                if calls is not None:
                    _serve_(namespace[function], int(calls), values, _emit_, _encode_)
                continue
            if kind == "ask":
                namespace["__candidate__"] = _asker_(int(calls), values)
            _exec(code, namespace)
    except BaseException:  # SystemExit and KeyboardInterrupt are failures too
        try:
            namespace.clear()  # free what the program holds: a MemoryError's report needs room
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
            # UNIX sockets stay inside the namespaces; one task: not even a thread
            _install_seccomp(unix_sockets=True, threads=int(request["processes"]) > 1)
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


SYSV_LIMITS = {"shmmax": "0", "shmall": "0", "shmmni": "0", "msgmni": "0", "sem": "0 0 0 0"}


def _close_sysv() -> None:
    """Zero the new IPC namespace's SysV limits: no shared memory, queues or semaphores. Where
    the kernel does not let this namespace's owner change them, the seccomp filter still
    refuses the calls."""
    for name, value in SYSV_LIMITS.items():
        try:  # noqa: SIM105 - contextlib would be one more import at every start
            _write("/proc/sys/kernel/" + name, value)
        except OSError:
            pass


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
        _close_sysv()
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


def _own_mounts(request: dict) -> None:
    """A mount namespace of this process's own (and a user namespace, mapping its uid and gid
    to themselves, when not root); a SetupError where the kernel refuses."""
    root = os.geteuid() == 0
    euid, egid = os.geteuid(), os.getegid()
    refused = not request["mount_namespace"]  # the grader's switch, to test the refusal
    if refused or libc.unshare(CLONE_NEWNS if root else CLONE_NEWNS | CLONE_NEWUSER) != 0:
        raise SetupError(
            "isolation=process needs a mount namespace (root, or unprivileged user "
            "namespaces) to show the program only the files it may use; none can be made here"
        )
    if not root:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{euid} {euid} 1")
        _write("/proc/self/gid_map", f"{egid} {egid} 1")


def _process(request: dict, status: int) -> None:
    """No PID, network or IPC namespace for the program: a mount namespace of its own with the
    new root of namespaces mode (an empty /proc: it would show the host's processes), Landlock
    (file access: the system and interpreter directories and site-packages read-only, less the
    hidden paths; the scratch folder and /tmp read and write), the limits, as root a uid of its
    own and otherwise every capability dropped, the seccomp filter (no sockets at all) and the
    guard.
    """
    root = os.geteuid() == 0
    uid = int(request["uid"]) if root else None
    try:
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _own_mounts(request)
        if uid is not None:
            _build_root(request, uid, procfs=False)
        else:
            _build_root(request, os.geteuid(), os.getegid(), procfs=False)
        os.chdir(SCRATCH)
        os.environ.update(HOME=SCRATCH, TMPDIR="/tmp")
        if not _landlock([SCRATCH, "/tmp"], request["site_packages"], request["hidden"]):
            raise SetupError(
                "isolation=process needs Landlock (Linux 5.13 or later) to confine the "
                "program's file access; use isolation=namespaces"
            )
        _set_limits(request)
        _drop_privileges(uid)  # as root a fresh uid; otherwise every capability
        _install_seccomp(unix_sockets=False, threads=int(request["processes"]) > 1)
    except (SetupError, OSError, ValueError) as exc:
        _report(status, f"error: {exc}")
        os._exit(1)
    _report(status, "ready")
    _finish(request)


def _site_packages(folders: list[str]) -> None:
    """Started with -S (no .pth files run: they cost tens of ms and run arbitrary code, and no
    site-packages of the interpreter's own): the grader names the site-packages folders of the
    environment it runs in, added to the path here; user site stays off."""
    for path in folders:
        if os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)


def main() -> None:
    if "" in sys.path:
        sys.path.remove("")
    request = marshal.loads(sys.stdin.buffer.read())
    _site_packages(request["site_packages"])
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
