"""Attacks on the grader and its neighbours, each refused or contained in both isolations with
correct neighbours graded correctly beside it; the scratch folder's cap and its cleanup; the
expected values a task computes in the sandbox kept out of the program's reach. Every attack
aims at a process, file or socket this test made, never at another of the machine's."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dllmbench.core.errors import UserError
from dllmbench.tasks import _sandbox_boot as boot
from dllmbench.tasks import cgroups
from dllmbench.tasks import sandbox as sandbox_module
from dllmbench.tasks.data import PACKAGED
from dllmbench.tasks.mbpp import Mbpp
from dllmbench.tasks.sandbox import Limits, Sandbox

pytestmark = pytest.mark.slow

ISOLATIONS = ["namespaces", "process"]

# The guard (an audit hook) switched off first, so that only the kernel stands.
UNGUARD = (
    "import sys, os, ctypes\n"
    "boot = sys.modules['__main__']\n"
    "boot._guard.__code__ = (lambda event, args: None).__code__\n"
    "boot.REFUSED = frozenset()\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def errno():\n"
    "    return ctypes.get_errno()\n"
)

CORRECT = [("program", "def f(n):\n    return sum(range(n))"), ("test", "f(10)", "eval")]


def _neighbours_and(attack: str, isolation: str, **limits) -> tuple[object, list[object]]:
    """The attack run beside three correct programs: (its outcome, theirs)."""
    sandbox = Sandbox(Limits(timeout=20, **limits), isolation)
    outcomes = sandbox.run_many([CORRECT, [("program", UNGUARD + attack)], CORRECT, CORRECT], 4)
    return outcomes[1], [outcomes[0], *outcomes[2:]]


def _assert_neighbours_right(neighbours) -> None:
    for outcome in neighbours:
        assert outcome.passed and outcome.values == ("('i','0x2d')",), outcome


@pytest.fixture
def victim():
    """A process of the test's own: what the attacks on other processes aim at."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_prlimit_on_another_process_is_refused(isolation, victim):
    before = resource.prlimit(victim.pid, resource.RLIMIT_NOFILE)
    attack = (
        "import resource\n"
        "resource.prlimit(os.getpid(), resource.RLIMIT_NOFILE)  # its own limits: allowed\n"
        "print('own limits read', flush=True)\n"
        f"resource.prlimit({victim.pid}, resource.RLIMIT_NOFILE, (7, 7))\n"
    )
    outcome, neighbours = _neighbours_and(attack, isolation)
    assert not outcome.passed and "PermissionError" in outcome.stderr, outcome
    assert "own limits read" in outcome.stdout  # it got past its own limits to the refusal
    assert resource.prlimit(victim.pid, resource.RLIMIT_NOFILE) == before
    _assert_neighbours_right(neighbours)


def _scheduling(pid: int) -> tuple:
    return (
        os.sched_getaffinity(pid),
        os.sched_getscheduler(pid),
        os.getpriority(os.PRIO_PROCESS, pid),
    )


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_scheduling_of_another_process_is_left_alone(isolation, victim):
    """Without a PID namespace the grader is a process of the program's own uid, which the
    kernel lets it re-schedule: its CPUs, its scheduling class, its priority and I/O class (of
    one process, or through PRIO_USER every process of the user), where its memory lies. Each
    is refused; the program may still change its own."""
    before = _scheduling(victim.pid), _scheduling(os.getpid())
    calls = boot.SYSCALLS[os.uname().machine][1]
    attack = (
        "import os\n"
        "os.sched_setaffinity(0, os.sched_getaffinity(0))  # its own: allowed\n"
        "os.setpriority(os.PRIO_PROCESS, 0, 5)\n"
        "print('own scheduling set', flush=True)\n"
        "refused = []\n"
        f"for pid in (os.getppid(), {victim.pid}):\n"
        "    for call in (\n"
        "        lambda: os.sched_setaffinity(pid, {0}),\n"
        "        lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)),\n"
        "        lambda: os.sched_setparam(pid, os.sched_param(0)),\n"
        "        lambda: os.setpriority(os.PRIO_PROCESS, pid, 19),\n"
        "    ):\n"
        "        try:\n"
        "            call()\n"
        "            refused.append(False)\n"
        "        except OSError:\n"
        "            refused.append(True)\n"
        f"    refused.append(libc.syscall({calls['ioprio_set']}, 1, pid, 3 << 13) == -1)\n"
        f"    refused.append(libc.syscall({calls['migrate_pages']}, pid, 64, None, None) == -1)\n"
        "refused.append(libc.setpriority(2, os.getuid(), 19) == -1)  # PRIO_USER: every process\n"
        "refused.append(libc.setpriority(1, 0, 19) == -1)  # PRIO_PGRP\n"
        "print('refused', refused, flush=True)\n"
        "assert all(refused)\n"
        "assert False, 'refused, and wrong'\n"
    )
    outcome, neighbours = _neighbours_and(attack, isolation)
    assert "own scheduling set" in outcome.stdout, outcome
    assert "refused, and wrong" in outcome.stderr, outcome  # every call above was refused
    assert not outcome.passed
    assert (_scheduling(victim.pid), _scheduling(os.getpid())) == before
    _assert_neighbours_right(neighbours)


FCNTL_SETOWN = (
    "import fcntl, signal\n"
    "r, w = os.pipe()\n"
    "refused = []\n"
    "for cmd, arg in ((8, VICTIM), (15, None), (10, int(signal.SIGKILL))):\n"
    "    if arg is None:  # F_SETOWN_EX {F_OWNER_PID, VICTIM}\n"
    "        owner = (ctypes.c_int * 2)(1, VICTIM)\n"
    "        rc = libc.fcntl(r, cmd, ctypes.byref(owner))\n"
    "    else:\n"
    "        rc = libc.fcntl(r, cmd, arg)\n"
    "    refused.append(rc == -1 and errno() == 1)\n"
    "pid = ctypes.c_int(VICTIM)\n"
    "refused.append(libc.ioctl(r, 0x8901, ctypes.byref(pid)) == -1)  # FIOSETOWN\n"
    "fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)\n"
    "os.write(w, b'x')  # SIGIO (or the signal set) to the owner\n"
    "print('refused', refused, flush=True)\n"
    "assert not all(refused)\n"
)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_signals_through_a_descriptors_owner_are_refused(isolation, victim):
    """F_SETOWN, F_SETOWN_EX and F_SETSIG (and FIOSETOWN) aimed at a process outside: with
    O_ASYNC, a write would send it SIGKILL."""
    outcome, neighbours = _neighbours_and(
        FCNTL_SETOWN.replace("VICTIM", str(victim.pid)), isolation
    )
    assert not outcome.passed, outcome
    assert "refused [True, True, True, True]" in outcome.stdout, outcome
    time.sleep(0.2)
    assert victim.poll() is None, "the sandboxed program signalled a process outside it"
    _assert_neighbours_right(neighbours)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_host_unix_sockets_are_out_of_reach(isolation, tmp_path):
    """A socket pair's end sending to a datagram socket of the host, by path and in the
    abstract namespace: nothing arrives (process mode refuses socket pairs; namespaces mode
    shows neither the path nor the host's abstract names)."""
    tmp_path.chmod(0o777)
    by_path = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    by_path.bind(str(tmp_path / "host.sock"))
    os.chmod(tmp_path / "host.sock", 0o777)
    abstract_name = f"\0dllmbench-test-{os.getpid()}-{isolation}"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    abstract.bind(abstract_name)
    attack = (
        "import struct\n"
        "pair = (ctypes.c_int * 2)()\n"
        "rc = libc.socketpair(1, 2, 0, pair)  # AF_UNIX, SOCK_DGRAM\n"
        "print('socketpair', rc, errno(), flush=True)\n"
        "assert rc == 0\n"
        "sent = 0\n"
        f"for name in ({str(tmp_path / 'host.sock').encode()!r}, {abstract_name.encode()!r}):\n"
        "    addr = struct.pack('=H', 1) + name\n"
        "    n = libc.sendto(pair[0], b'hello', 5, 0, addr, len(addr))\n"
        "    print('sendto', n, errno(), flush=True)\n"
        "    sent += n == 5\n"
        "assert sent\n"
    )
    try:
        outcome, neighbours = _neighbours_and(attack, isolation)
        assert not outcome.passed, outcome
        if isolation == "process":
            assert "socketpair -1 1" in outcome.stdout, outcome
        for sock in (by_path, abstract):
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(16)
        _assert_neighbours_right(neighbours)
    finally:
        by_path.close()
        abstract.close()


NEST = (
    "print('scratch', os.getcwd(), flush=True)\n"
    "for i in range(1500):\n"
    "    os.mkdir('d')\n"
    "    os.chdir('d')\n"
    "    open('f', 'w').close()\n"
    "print('nested', flush=True)\n"
)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_deep_tree_in_scratch_beside_neighbours(isolation):
    outcome, neighbours = _neighbours_and(NEST, isolation)
    assert outcome.passed, outcome  # a deep tree is allowed; it must just not hurt anyone
    _assert_neighbours_right(neighbours)


FILL = (
    "held = 0\n"
    "try:\n"
    "    for i in range(128):\n"
    "        with open(f'fill{i}', 'wb') as fh:\n"
    "            for _ in range(8):\n"
    "                fh.write(bytes(1 << 20))\n"
    "                fh.flush()\n"
    "                held += 1\n"
    "                print('held', held, flush=True)\n"
    "except OSError as exc:\n"
    "    print('stopped', exc, flush=True)\n"
    "assert held >= 1024, held\n"
)


def _held(stdout: str) -> int:
    return max([int(line.split()[1]) for line in stdout.splitlines() if line.startswith("held")])


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_gigabyte_fill_of_scratch_is_capped(isolation):
    outcome, neighbours = _neighbours_and(FILL, isolation, tmpfs_mb=32, file_mb=64)
    assert not outcome.passed, outcome
    assert _held(outcome.stdout) <= 32, outcome.stdout[-300:]
    _assert_neighbours_right(neighbours)


def test_process_mode_without_a_mount_namespace_refuses_in_one_line(monkeypatch):
    monkeypatch.setattr(sandbox_module, "MOUNT_NAMESPACE", False)
    with pytest.raises(UserError) as info:
        Sandbox(Limits(timeout=20), "process").run(CORRECT)
    message = str(info.value)
    assert "\n" not in message and "needs a mount namespace" in message


THREADS = (
    "import threading\n"
    "started = []\n"
    "for _ in range(8):\n"
    "    try:\n"
    "        threading.Thread(target=started.append, args=(1,)).start()\n"
    "    except RuntimeError:\n"
    "        pass\n"
    "print('started', len(started), flush=True)\n"
)


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("with_cgroups", [True, False])
def test_one_task_means_no_thread(isolation, with_cgroups, monkeypatch):
    if not with_cgroups:
        monkeypatch.setattr(cgroups, "hierarchies", lambda: None)
    outcome = Sandbox(Limits(timeout=20), isolation).run([("program", UNGUARD + THREADS)])
    assert outcome.passed and "started 0" in outcome.stdout, outcome


SLEEPERS = (
    "import threading, time\n"
    "started = 0\n"
    "for _ in range(8):\n"
    "    try:\n"
    "        threading.Thread(target=time.sleep, args=(3,), daemon=True).start()\n"
    "        started += 1\n"
    "    except RuntimeError:\n"
    "        pass\n"
    "print('started', started, flush=True)\n"
)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_without_a_cgroup_the_uid_bounds_a_programs_threads(isolation, monkeypatch):
    """As root, in either isolation, the program runs as a uid of its own, so RLIMIT_NPROC
    holds it to `processes` tasks where no cgroup does."""
    if os.geteuid() != 0:
        pytest.skip("as another user RLIMIT_NPROC counts that user's other processes too")
    monkeypatch.setattr(cgroups, "hierarchies", lambda: None)
    sandbox = Sandbox(Limits(timeout=20, processes=4), isolation)
    outcome = sandbox.run([("program", UNGUARD + SLEEPERS + "print('uid', os.getuid())")])
    assert outcome.passed and "started 3" in outcome.stdout, outcome
    assert "uid 0" not in outcome.stdout


# -- task 596: its expected side is computed in the sandbox ---------------------------------------

READ_EVERY_DESCRIPTOR = (
    "import fcntl\n"
    "found = b''\n"
    "for fd in range(3, 64):\n"
    "    try:\n"
    "        flags = os.O_RDONLY | os.O_NONBLOCK\n"
    "        again = os.open(f'/proc/self/fd/{fd}', flags)\n"
    "    except OSError:\n"
    "        continue\n"
    "    try:\n"
    "        found += os.read(again, 1 << 16)\n"
    "    except OSError:\n"
    "        pass\n"
    "print('found', found, flush=True)\n"
)

FORGE = (
    "for fd in range(3, 64):\n"
    "    try:\n"
    "        os.write(fd, b\"11\\n('i','0x9')\" * 6)\n"
    "    except OSError:\n"
    "        pass\n"
    "def tuple_size(t):\n"
    "    return 9\n"
)


@pytest.fixture(scope="module")
def task596():
    task = Mbpp(data=str(PACKAGED), timeout=10.0, workers=4)
    problem = next(p for p in task.problems("validation") if p.id == "596")
    assert all(c.before for c in problem.gold.checks)
    return task, problem


def test_596_the_program_never_sees_the_expected_values(task596):
    task, problem = task596
    assert task.before_steps(problem) and all(
        step[0] != "program" for step in task.before_steps(problem)
    )
    assert not any(step[0] == "imports" for step in task.steps(problem, "x = 1"))
    outcome = task.sandbox.run(task.steps(problem, UNGUARD + READ_EVERY_DESCRIPTOR))
    assert "found b''" in outcome.stdout, outcome


def test_596_forged_values_are_graded_wrong_every_time(task596):
    task, problem = task596
    forged = [UNGUARD + READ_EVERY_DESCRIPTOR + FORGE + f"# {i}\n" for i in range(20)]
    assert not any(task.grade(problem, program, program) for program in forged[:10])
    items = [(problem, program, program) for program in forged[10:]]
    items += [(problem, problem.gold.reference, "")] * 2
    grades = task.grade_many(items)
    assert grades == [False] * 10 + [True, True]
    assert task.grade(problem, problem.gold.reference, "")


# -- timeouts ---------------------------------------------------------------------------------

BLOCKER = "import time\nprint('start', time.time(), flush=True)\ntime.sleep(600)\n"


def test_programs_that_time_out_are_run_again_side_by_side():
    """Eight programs that block until their 3 s timeout: their second runs overlap (each
    started before the first of them could have timed out), so they cost one more timeout,
    not eight."""
    sandbox = Sandbox(Limits(timeout=3))
    outcomes = sandbox.run_many([[("program", BLOCKER)]] * 8, workers=8)
    assert [(o.status, o.reran) for o in outcomes] == [("timeout", True)] * 8, outcomes
    starts = sorted(float(o.stdout.split()[1]) for o in outcomes)
    assert starts[-1] - starts[0] < 3, starts  # all eight second runs at once: they overlap


# -- Landlock's own scoping, behind the filter ----------------------------------------------------

SCOPED = """
import ctypes, os, socket, sys
from dllmbench.tasks import _sandbox_boot as boot
victim, scratch, name = int(sys.argv[1]), sys.argv[2], chr(0) + sys.argv[3]
abi = boot._landlock_abi()
assert boot._landlock([scratch], [], [])
try:
    os.kill(victim, 0)
    print("signal sent")
except PermissionError:
    print("signal refused")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    s.sendto(b"x", name)
    print("abstract sent")
except PermissionError:
    print("abstract refused")
"""


def test_landlock_scopes_signals_and_abstract_sockets_on_its_own(victim, tmp_path):
    """Without the seccomp filter (which refuses both first), Landlock alone (ABI 6) keeps a
    confined process from signalling a process outside and from reaching a host's abstract
    socket."""
    from dllmbench.tasks import _sandbox_boot as boot

    if boot._landlock_abi() < 6:
        pytest.skip("Landlock ABI 6 (signal and abstract socket scoping) is not here")
    name = f"\0dllmbench-scope-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(name)
    try:
        result = subprocess.run(
            [sys.executable, "-c", SCOPED, str(victim.pid), str(tmp_path), name[1:]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr[-1000:]
        assert result.stdout.split("\n")[:2] == ["signal refused", "abstract refused"]
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.recv(8)
    finally:
        listener.close()
    assert victim.poll() is None


METADATA_AND_IPC = (
    "import fcntl\n"
    "done = {}\n"
    "def attempt(name, call):\n"
    "    try:\n"
    "        rc = call()\n"
    "        done[name] = 'errno %d' % errno() if rc == -1 else 'done'\n"
    "    except OSError as exc:\n"
    "        done[name] = 'errno %d' % exc.errno\n"
    "attempt('chmod', lambda: os.chmod(TARGET, 0o666))\n"
    "attempt('utime', lambda: os.utime(TARGET, (0, 0)))\n"
    "attempt('setxattr', lambda: os.setxattr(TARGET, 'user.dllmbench', b'1'))\n"
    "shown = os.open(SHOWN, os.O_RDONLY)\n"
    "attempt('flock', lambda: fcntl.flock(shown, fcntl.LOCK_SH | fcntl.LOCK_NB))\n"
    "attempt('lockf', lambda: fcntl.lockf(shown, fcntl.LOCK_SH | fcntl.LOCK_NB))\n"
    "attempt('lease', lambda: fcntl.fcntl(shown, 1024, fcntl.F_RDLCK))\n"
    "attempt('inotify', lambda: libc.inotify_init1(0))\n"
    "libc.mq_open.restype = ctypes.c_int\n"
    "attempt('mq_open', lambda: libc.mq_open(QUEUE, 0o100 | 2, 0o600, None))\n"
    "print('attempts', sorted(done.items()), flush=True)\n"
    "assert all(v == 'done' for v in done.values())\n"
)


HOST = (
    "seen = {}\n"
    "for path in PATHS:\n"
    "    try:\n"
    "        os.stat(path)\n"
    "        seen[path] = 'shown'\n"
    "    except FileNotFoundError:\n"
    "        seen[path] = 'absent'\n"
    "    except OSError as exc:\n"
    "        seen[path] = f'errno {exc.errno}'\n"
    "    if os.access(path, os.F_OK):\n"
    "        seen[path] += ' accessed'\n"
    "print('seen', sorted(seen.items()), 'uid', os.getuid(), flush=True)\n"
)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_host_files_and_processes_are_not_even_stated(isolation, tmp_path, victim):
    """The test's own file, folder and process do not exist for the program, to `stat`,
    `access` or /proc: it sees a root of its own in either isolation (process mode: a mount
    namespace of its own, an empty /proc); as root it runs as a uid of its own."""
    (tmp_path / "host-file").write_text("x")
    paths = [str(tmp_path / "host-file"), str(tmp_path), f"/proc/{victim.pid}", "/proc/1"]
    outcome, neighbours = _neighbours_and(HOST.replace("PATHS", repr(paths)), isolation)
    assert outcome.passed, outcome
    line = next(x for x in outcome.stdout.splitlines() if x.startswith("seen"))
    seen = dict(eval(line[len("seen ") : line.rindex(" uid ")]))  # the program's printout
    assert seen == dict.fromkeys(paths[:3], "absent") | {"/proc/1": seen["/proc/1"]}, seen
    if isolation == "process":  # no PID namespace: no process at all shows
        assert seen["/proc/1"] == "absent", seen
    if os.geteuid() == 0:
        assert int(line.rsplit(" ", 1)[1]) >= sandbox_module.UID_BASE, line
    _assert_neighbours_right(neighbours)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_file_metadata_locks_leases_watches_and_queues_are_refused(isolation, tmp_path):
    """chmod, utime and setxattr of a host file (process mode: Landlock does not cover
    metadata), flock, a POSIX lock and a lease on a file the sandbox shows read-only (a host
    reader would block), inotify, and a POSIX message queue that would outlive the run: each
    refused, the file and the queue names as they were. The files and the queue name are the
    test's own."""
    import sysconfig

    target = tmp_path / "host-file"
    target.write_text("x")
    target.chmod(0o600)
    before = target.stat()
    shown = Path(sysconfig.get_paths()["purelib"]) / f"dllmbench-test-{os.getpid()}.txt"
    shown.write_text("shown read-only to the program")
    queue = f"/dllmbench-test-{os.getpid()}-{isolation}".encode()
    attack = (
        METADATA_AND_IPC.replace("TARGET", repr(str(target)))
        .replace("SHOWN", repr(str(shown)))
        .replace("QUEUE", repr(queue))
    )
    try:
        outcome, neighbours = _neighbours_and(attack, isolation)
    finally:
        shown.unlink()
    assert not outcome.passed, outcome
    line = next(x for x in outcome.stdout.splitlines() if x.startswith("attempts"))
    attempts = dict(eval(line[len("attempts ") :]))  # the program's own printout
    assert set(attempts) == {
        "chmod",
        "utime",
        "setxattr",
        "flock",
        "lockf",
        "lease",
        "inotify",
        "mq_open",
    }, attempts
    assert "done" not in attempts.values(), attempts
    if isolation == "process":  # the filter refused them (the file is visible there)
        for name in ("chmod", "utime", "setxattr", "flock", "lockf", "lease", "inotify"):
            assert attempts[name] == "errno 1", attempts
    after = target.stat()
    assert (after.st_mode, after.st_mtime_ns) == (before.st_mode, before.st_mtime_ns)
    assert "user.dllmbench" not in os.listxattr(target)
    mqueue = Path("/dev/mqueue") / queue.decode().lstrip("/")
    assert not mqueue.exists()
    _assert_neighbours_right(neighbours)
