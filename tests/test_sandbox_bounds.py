"""The sandbox's kernel-enforced bounds: the seccomp filter holds after the audit hook is
switched off in pure Python, memory parked outside any process is bounded by the run's control
group, neighbours cannot change a grade, and isolation=process confines what it can."""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from dllmbench.tasks import _sandbox_boot as boot
from dllmbench.tasks import cgroups
from dllmbench.tasks.sandbox import Limits, Sandbox

pytestmark = pytest.mark.slow

# The guard is the boot code's `_guard`, an audit hook that cannot be removed but whose code a
# program can replace; every program below does that first, so only the kernel stands.
UNGUARD = (
    "import sys, os, ctypes\n"
    "boot = sys.modules['__main__']\n"
    "boot._guard.__code__ = (lambda event, args: None).__code__\n"
    "boot.REFUSED = frozenset()\n"
    "os.kill(os.getpid(), 0)  # refused by the guard: reaching the kernel shows it is off\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def refused(rc):\n"
    "    return rc == -1 and ctypes.get_errno() in (1, 38)  # EPERM (ENOSYS for clone3)\n"
)

NEEDS_CGROUPS = pytest.mark.skipif(
    cgroups.hierarchies() is None,
    reason="this machine gives no writable cgroup (memory, pids, cpu) to this process",
)


def _run(program: str, isolation: str = "namespaces", **limits) -> object:
    return Sandbox(Limits(timeout=20, **limits), isolation).run([("program", program)])


ESCAPES = {
    "fork": "pid = os.fork()\nif pid == 0:\n    os._exit(0)",
    "libc fork": "assert not refused(libc.fork())\nos._exit(0)",
    "raw clone": "assert not refused(libc.syscall(56, 17, 0, 0, 0, 0))",
    "clone3": "assert not refused(libc.syscall(435, 0, 0))",
    "exec": "os.execv('/bin/true', ['true'])",
    "libc execve": "assert not refused(libc.execve(b'/bin/true', None, None))",
    "fork_exec": "import _posixsubprocess, subprocess\nsubprocess.run(['/bin/true'])",
    "user namespace": "assert not refused(libc.unshare(0x10000000))",
    "mount namespace": "assert not refused(libc.unshare(0x00020000))",
    "inet socket": "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)",
    "raw socket": "assert not refused(libc.socket(2, 3, 1))",
    "packet socket": "assert not refused(libc.socket(17, 3, 0))",
    # aimed at a process the test started (VICTIM), never at one of the machine's
    "ptrace": "assert libc.ptrace(16, VICTIM, 0, 0) == 0",
    "signal to a process outside": "assert libc.kill(VICTIM, 9) == 0",
    "signal to the group": "assert not refused(libc.kill(0, 9))",
    "keyring": "assert not refused(libc.syscall(248, b'user', b'k', b'v', 1, -3))",
    "sysv shm": "assert not refused(libc.shmget(0, 1 << 20, 0o1600))",
    "memfd": "assert not refused(libc.memfd_create(b'x', 0))",
    "io_uring": "assert not refused(libc.syscall(425, 8, ctypes.create_string_buffer(120)))",
    "bpf": "assert not refused(libc.syscall(321, 0, 0, 0))",
    "userfaultfd": "assert not refused(libc.syscall(323, 0))",
}


@pytest.fixture
def victim():
    """A process of the test's own, outside the sandbox: what the attacks on other processes
    aim at."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("isolation", ["namespaces", "process"])
@pytest.mark.parametrize("name", ESCAPES)
def test_escapes_fail_after_the_guard_is_switched_off(name, isolation, victim):
    """Each program succeeds only if its escape works; every one must fail, and fail on the
    kernel's refusal (an OSError or a refused call), not on the guard."""
    outcome = _run(UNGUARD + ESCAPES[name].replace("VICTIM", str(victim.pid)), isolation)
    assert not outcome.passed, (name, outcome)
    assert victim.poll() is None, "the sandboxed program reached a process outside it"
    assert "refuses" not in outcome.stderr  # the guard was off: the kernel refused
    assert re.search(
        r"PermissionError|AssertionError|OSError|Operation not permitted", outcome.stderr
    ), outcome.stderr


@pytest.mark.parametrize("isolation", ["namespaces", "process"])
def test_what_programs_need_still_works_under_the_filter(isolation):
    program = (
        "import threading, signal, os, math, json, collections, re\n"
        "got = []\n"
        "signal.signal(signal.SIGUSR1, lambda *a: got.append(1))\n"
        "signal.raise_signal(signal.SIGUSR1)  # signals to itself: allowed\n"
        "assert got == [1]\n"
        "open('f.txt', 'w').write('kept')\nassert open('f.txt').read() == 'kept'\n"
        "print(json.dumps(collections.Counter('abca')), math.comb(5, 2))\n"
    )
    outcome = Sandbox(Limits(timeout=20, processes=2), isolation).run([("program", program)])
    assert outcome.passed, outcome
    threads = "import threading\nt = threading.Thread(target=print)\nt.start()\nt.join()\n"
    assert Sandbox(Limits(timeout=20, processes=2), isolation).run([("t", threads)]).passed
    # the default is one task: a program may not start a thread (MBPP needs none)
    assert not Sandbox(Limits(timeout=20), isolation).run([("t", threads)]).passed


HOLD = (
    "CHUNK = 64 << 20\n"
    "held = 0\n"
    "def hold(write):\n"
    "    global held\n"
    "    while held < (2 << 30):\n"
    "        write(CHUNK)\n"
    "        held += CHUNK\n"
    "        print('held', held >> 20, flush=True)\n"
)

PARKERS = {
    # SysV shared memory: segments outlive their process; touched page by page
    "sysv shm": (
        "def write(n):\n"
        "    seg = libc.shmget(0, n, 0o1600)\n"
        "    assert seg >= 0, ctypes.get_errno()\n"
        "    libc.shmat.restype = ctypes.c_void_p\n"
        "    at = libc.shmat(seg, None, 0)\n"
        "    ctypes.memset(at, 1, n)\n"
        "    libc.shmdt(ctypes.c_void_p(at))\n"
        "hold(write)\n"
    ),
    # a tmpfs of its own, mounted in nested user and mount namespaces
    "nested tmpfs": (
        "assert libc.unshare(0x10000000 | 0x00020000) == 0, ctypes.get_errno()\n"
        "os.makedirs('m', exist_ok=True)\n"
        "assert libc.mount(b'none', b'm', b'tmpfs', 0, b'size=4g') == 0, ctypes.get_errno()\n"
        "files = iter(range(10**6))\n"
        "def write(n):\n"
        "    with open(f'm/{next(files)}', 'wb') as fh:\n"
        "        fh.write(bytes(n))\n"
        "hold(write)\n"
    ),
    # memfds: anonymous files, kept open
    "memfd": (
        "fds = []\n"
        "def write(n):\n"
        "    fd = libc.memfd_create(b'x', 0)\n"
        "    assert fd >= 0, ctypes.get_errno()\n"
        "    os.write(fd, bytes(n))\n"
        "    fds.append(fd)\n"
        "hold(write)\n"
    ),
}


def _held_mb(stdout: str) -> int:
    return max([int(n) for n in re.findall(r"^held (\d+)$", stdout, re.M)], default=0)


@pytest.mark.parametrize("with_cgroups", [True, False])
@pytest.mark.parametrize("name", PARKERS)
def test_memory_outside_processes_is_bounded(name, with_cgroups, monkeypatch):
    """A program trying to park 2 GiB where no process owns it holds no more than its limit,
    with a cgroup per run or without one (where cgroups are not writable)."""
    if not with_cgroups:
        monkeypatch.setattr(cgroups, "hierarchies", lambda: None)
    limit_mb = 160
    outcome = _run(UNGUARD + HOLD + PARKERS[name], memory_mb=limit_mb)
    assert not outcome.passed, outcome
    assert _held_mb(outcome.stdout) <= limit_mb, outcome.stdout[-300:]
    if with_cgroups and cgroups.hierarchies() is not None:  # the kernel's own count
        assert outcome.memory_peak_mb is not None and outcome.memory_peak_mb <= limit_mb
    if not with_cgroups:
        assert outcome.memory_peak_mb is None


@NEEDS_CGROUPS
def test_the_run_cgroup_bounds_memory_the_filter_allows():
    """Files in the run's own /tmp (a tmpfs offered more than the memory limit) are charged to
    the run's cgroup: past the limit the kernel ends the program, not a neighbour."""
    limit_mb = 128
    program = HOLD.replace("64 << 20", "16 << 20") + (
        "files = iter(range(10**6))\n"
        "def write(n):\n"
        "    with open(f'/tmp/{next(files)}', 'wb') as fh:\n"
        "        fh.write(bytes(n))\n"
        "hold(write)\n"
    )
    outcome = Sandbox(Limits(timeout=30, memory_mb=limit_mb, tmpfs_mb=1024, file_mb=64)).run(
        [("program", program)]
    )
    assert outcome.status == "memory_limit", outcome
    assert _held_mb(outcome.stdout) <= limit_mb
    assert outcome.memory_peak_mb is not None and outcome.memory_peak_mb <= limit_mb


RELAY = (
    "import threading, os\n"
    "for _ in range(16):  # relay CPU through children and threads: all refused\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            while True:\n"
    "                pass\n"
    "    except OSError:\n"
    "        pass\n"
    "    try:\n"
    "        threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n"
    "    except RuntimeError:\n"
    "        pass\n"
    "while True:\n"
    "    pass\n"
)

CORRECT = (
    "def f(n):\n"
    "    total = 0\n"
    "    for i in range(n):\n"
    "        total += i * i % 7\n"
    "    return total\n"
)


def test_a_grade_does_not_change_beside_cpu_relaying_neighbours():
    # The neighbours burn their 2 CPU seconds (killed: not a timeout, so not re-run); the
    # correct program needs a fraction of one, alone.
    sandbox = Sandbox(Limits(timeout=12, cpu_seconds=2))
    correct = [("program", CORRECT), ("test", "f(2_000_000)", "eval")]
    alone = sandbox.run(correct)
    assert alone.passed and alone.values, alone  # it computed its value, alone
    outcomes = sandbox.run_many([correct] + [[("program", UNGUARD + RELAY)]] * 7, workers=8)
    assert outcomes[0].passed, outcomes[0]
    assert outcomes[0].values == alone.values
    assert not any(o.passed for o in outcomes[1:])
    assert {o.status for o in outcomes[1:]} <= {"killed", "timeout"}


def test_a_timeout_beside_others_is_run_again_alone(monkeypatch):
    """The second, lone run decides, and the outcome says it was one."""
    sandbox = Sandbox(Limits(timeout=3))
    calls = []
    real = Sandbox.run

    def run(self, steps):
        calls.append(steps)
        if len(calls) == 1:  # the first run of the first program "times out"
            outcome = real(self, [("program", "import time\ntime.sleep(60)")])
            assert outcome.status == "timeout"
            return outcome
        return real(self, steps)

    monkeypatch.setattr(Sandbox, "run", run)
    good = [("program", "x = 1"), ("test", "assert x == 1")]
    outcomes = sandbox.run_many([good, good], workers=2)
    assert [o.passed for o in outcomes] == [True, True]
    assert outcomes[0].reran and not outcomes[1].reran
    assert len(calls) == 3
    # a program that times out alone too still fails, once re-run
    monkeypatch.setattr(Sandbox, "run", real)
    slow = [("program", "import time\ntime.sleep(60)")]
    outcomes = sandbox.run_many([slow, good], workers=2)
    assert outcomes[0].status == "timeout" and outcomes[0].reran and outcomes[1].passed


def test_etc_holds_only_what_the_interpreter_needs():
    outcome = _run(
        "import os, pwd, time\n"
        "print(sorted(os.listdir('/etc')))\n"
        "print(pwd.getpwuid(os.getuid()).pw_name, time.tzname[0] != '')\n"
    )
    assert outcome.passed, outcome
    listing, user = outcome.stdout.splitlines()
    names = set(eval(listing))
    assert names <= {
        "ld.so.cache",
        "ld.so.conf",
        "ld.so.conf.d",
        "localtime",
        "passwd",
        "group",
        "hosts",
    }, names
    assert user.split()[0] in ("sandbox", "root")


def test_process_isolation_confines_files_network_and_descendants(tmp_path):
    """Without PID, network and IPC namespaces: no capabilities, file access confined to the
    interpreter and its own scratch and /tmp, no sockets, no descendants."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    tmp_path.chmod(0o777)
    victim.chmod(0o666)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    attempts = {
        "write": f"open({str(victim)!r}, 'w').write('x')",
        "read": f"print(open({str(victim)!r}).read())",
        "delete": f"os.remove({str(victim)!r})",
        "connect": (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"),
        "setsid grandchild": (
            "pid = libc.fork()\n"
            "assert pid != -1, ctypes.get_errno()\n"
            "if pid == 0:\n"
            "    libc.setsid()\n"
            "    import time\n"
            "    time.sleep(30)\n"
            "    os._exit(0)\n"
        ),
        "capabilities": "assert libc.setuid(1234) == 0, ctypes.get_errno()",
    }
    sandbox = Sandbox(Limits(timeout=10), "process")
    outcomes = {
        name: sandbox.run([("program", UNGUARD + source)]) for name, source in attempts.items()
    }
    for name, outcome in outcomes.items():
        assert not outcome.passed, (name, outcome)
    assert victim.read_text() == "keep me"
    # its /tmp is a tmpfs of its own: what it writes there never reaches the host's
    probe = f"/tmp/dllmbench-probe-{os.getpid()}"
    assert sandbox.run([("program", f"open({probe!r}, 'w').write('x')")]).passed
    assert not Path(probe).exists()
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
    assert sandbox.run([("program", "open('here.txt', 'w').write('ok')")]).passed


def _filter_verdict(program, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """Run a classic-BPF seccomp program on one synthetic call (struct seccomp_data)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == boot.LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == boot.RET_K:
            return k
        else:
            taken = {
                boot.JEQ_K: acc == k,
                boot.JGE_K: acc >= k,
                boot.JSET_K: bool(acc & k),
            }[code]
            pc += jt if taken else jf
        pc += 1


@pytest.mark.parametrize("machine", sorted(boot.SYSCALLS))
def test_the_seccomp_program_of_each_architecture(machine):
    """The filter built for each architecture (aarch64 included, which this suite cannot run
    natively), checked call by call in a small BPF interpreter."""
    arch, table = boot.SYSCALLS[machine]
    me = 2
    program = boot.seccomp_program(machine, me, unix_sockets=True)
    allow, eperm = boot.SECCOMP_RET_ALLOW, boot.SECCOMP_RET_ERRNO | boot.EPERM

    def verdict(name_or_nr, *args, arch=arch):
        nr = table[name_or_nr] if isinstance(name_or_nr, str) else name_or_nr
        return _filter_verdict(program, arch, nr, args)

    conditional = ("clone", "clone3", "socket", "socketpair", "fcntl", "ioctl", *boot.ON_ITSELF)
    for name in table:
        if name not in (*conditional, *boot.SIGNALS_TO_SELF):
            assert verdict(name) == eperm, name
    assert verdict("clone3") == boot.SECCOMP_RET_ERRNO | boot.ENOSYS
    assert verdict("clone", 0x3D0F00) == allow  # the flags of a thread (glibc's pthread_create)
    assert verdict("clone", 0x01200011) == eperm  # fork's flags
    assert verdict("socket", 1, 1) == allow and verdict("socket", 2, 1) == eperm
    assert verdict("socketpair", 1, 1) == allow and verdict("socketpair", 2, 1) == eperm
    # its own limits (pid 0 or its own), never another process's
    assert verdict("prlimit64", 0, 7) == allow and verdict("prlimit64", me, 7) == allow
    assert verdict("prlimit64", 1, 7) == eperm and verdict("prlimit64", me + 1, 7) == eperm
    # its own scheduling, priority and memory placement; never another process's, a group's
    # or a user's (PRIO_PGRP, PRIO_USER; IOPRIO_WHO_PGRP, IOPRIO_WHO_USER)
    for name in ("sched_setparam", "sched_setscheduler", "sched_setaffinity", "sched_setattr"):
        assert verdict(name, 0, 5) == allow and verdict(name, me, 5) == allow, name
        assert verdict(name, 1, 5) == eperm and verdict(name, me + 1, 5) == eperm, name
    for name in ("migrate_pages", "move_pages"):
        assert verdict(name, 0) == allow and verdict(name, 1) == eperm, name
    assert verdict("setpriority", 0, 0, 10) == allow and verdict("setpriority", 0, me, 10) == allow
    assert verdict("setpriority", 0, 1, 10) == eperm
    assert verdict("setpriority", 1, 0, 10) == eperm and verdict("setpriority", 2, me, 10) == eperm
    assert verdict("ioprio_set", 1, 0, 3 << 13) == allow
    assert verdict("ioprio_set", 1, me, 3 << 13) == allow
    assert verdict("ioprio_set", 1, 1, 3 << 13) == eperm
    assert verdict("ioprio_set", 2, 0, 3 << 13) == eperm
    assert verdict("ioprio_set", 3, me, 3 << 13) == eperm
    # a descriptor's signals aimed elsewhere: F_SETOWN, F_SETSIG, F_SETOWN_EX; FIOSETOWN
    for cmd in (8, 10, 15):
        assert verdict("fcntl", 3, cmd, 1) == eperm, cmd
    for cmd in (0, 1, 2, 3, 4, 9, 16, 1030):  # F_DUPFD, F_GETFD…, F_GETOWN, F_DUPFD_CLOEXEC
        assert verdict("fcntl", 3, cmd) == allow, cmd
    assert verdict("ioctl", 3, 0x8901) == eperm and verdict("ioctl", 3, 0x8902) == eperm
    assert verdict("ioctl", 1, 0x5401) == allow  # TCGETS
    for name in boot.SIGNALS_TO_SELF:
        assert verdict(name, me, 10) == allow and verdict(name, 1, 9) == eperm, name
    assert verdict("kill", 0, 9) == eperm and verdict("kill", 2**32 - 1, 9) == eperm
    read = {"x86_64": 0, "aarch64": 63}[machine]
    assert verdict(read) == allow
    assert verdict(read, arch=0x40000003) == boot.SECCOMP_RET_KILL_PROCESS  # i386 table
    if machine == "x86_64":  # the x32 table
        assert verdict(boot.X32_SYSCALL_BIT + read) == eperm
    no_unix = boot.seccomp_program(machine, me, unix_sockets=False)
    assert _filter_verdict(no_unix, arch, table["socket"], (1, 1)) == eperm
    assert _filter_verdict(no_unix, arch, table["socketpair"], (1, 1)) == eperm
    one_task = boot.seccomp_program(machine, me, unix_sockets=True, threads=False)
    assert _filter_verdict(one_task, arch, table["clone"], (0x3D0F00,)) == eperm
    assert len(program) < 4096  # the kernel's limit on a filter's length


def test_a_rerun_is_said_in_the_grade_note(monkeypatch):
    """MBPP says in the record's grade note that a grade came from a lone second run."""
    from dllmbench.loading.registry import registry

    task = registry().task("mbpp", workers=2)
    problem = task.problems("test")[0]
    real = Sandbox.run
    first = []

    def run(self, steps):
        if not first:  # the first program's first run "times out"
            first.append(steps)
            return real(self, [("program", "import time\ntime.sleep(60)")])
        return real(self, steps)

    monkeypatch.setattr(Sandbox, "run", run)
    monkeypatch.setattr(task.sandbox, "limits", Limits(timeout=3))
    answers = [problem.gold.reference, "def nothing(): pass"]
    assert task.grade_many([(problem, a, a) for a in answers]) == [True, False]
    assert task.grade_note(problem, answers[0]) == (
        "timed out beside other programs; run again: passed"
    )
    assert task.grade_note(problem, answers[1]) is None
