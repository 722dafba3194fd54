"""Run untrusted Python programs in a sandbox, one fresh process each, many at a time.

A program is a list of steps (source strings, e.g. the generated code, a setup, each assert);
it passes when every step runs to the end. An "eval" step's value comes back as data on a pipe
of its own (`Outcome.values`), for the caller to judge outside the program's process. Each run
is a fresh interpreter started with a clean environment (`python -S -s -B [-P] -c`,
PYTHONHASHSEED=0 so that set and dict orders, and so the grades, repeat between runs) in its own
session and its own control group (`cgroups.RunGroup`: memory including tmpfs, shared memory and
memfds, tasks, one CPU; where cgroups are writable), whose child side (`_sandbox_boot.py`) sets up

- isolation "namespaces" (the default): new mount, network, PID, IPC and UTS namespaces (and a
  user namespace when not root); a new root holding only read-only system and interpreter
  directories, a minimal /etc, a private /tmp and the scratch directory (cwd), each a small
  tmpfs; no network interface but a down loopback; a /proc of its own; zero SysV limits; then,
  as root, a fresh unprivileged uid, otherwise no capabilities; no_new_privs;
- isolation "process": a mount namespace only (and a user namespace when not root), holding
  the same new root with an empty /proc; Landlock (required) confining file access to reading
  the system and interpreter folders and the environment's site-packages and writing its
  scratch directory and /tmp; as root a fresh unprivileged uid, otherwise no capabilities;
  for machines where the other namespaces cannot be made;
- a seccomp filter: no processes (no threads either with one task), no exec, no sockets or
  socket pairs but AF_UNIX (none in "process" mode), no namespaces, mounts, ptrace, keyrings,
  SysV IPC, POSIX message queues, memfds, bpf, io_uring, no signals, prlimit or descriptor
  owners (F_SETOWN, F_SETSIG) aimed at other processes; no change to any file's metadata
  (chmod, chown, utime and xattr families: Landlock does not cover metadata), no file locks or
  leases (flock, F_SETLK, F_OFD_SETLK, F_SETLEASE: a shown file locked would block its host
  readers), no inotify or fanotify;
- resource limits: CPU seconds, address space, tasks, file size, open files, no core;
- a guard (an audit hook) that refuses sockets, process creation and signals with a readable
  error (the filter is what holds when a program switches the guard off).

The grader enforces a wall-clock limit and an output cap (stdout and stderr together), and on
either kills the control group and the process group; the PID namespace dies with its first
process, so nothing the program started survives it. `run_many` runs programs side by side and
runs those that timed out again, once, side by side with each other. `converse` runs two
programs side by side that talk through the grader only, record by record, each record checked
on the way (a judge without the program asking, the program answering). The child imports from the
site-packages of the environment running dllmbench, never seeing dllmbench's own package, data
or metadata (`hidden_paths`).
"""

from __future__ import annotations

import contextlib
import fcntl
import marshal
import os
import queue
import secrets
import selectors
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

from dllmbench.core.errors import UserError
from dllmbench.tasks.cgroups import RunGroup

ISOLATIONS = ("namespaces", "process")
UID_BASE, UID_SPAN = 40000, 25000  # fresh uids for programs when running as root
# One lock file per uid, held (flock) by the run using it; root only, so a root-owned folder.
UID_LOCKS = Path("/run" if os.path.isdir("/run") else tempfile.gettempdir(), "dllmbench-uids")


@dataclass(frozen=True)
class Limits:
    """What one program may use."""

    timeout: float = 15.0  # wall-clock seconds, interpreter start included
    cpu_seconds: int = 5  # RLIMIT_CPU: the process is killed past it
    memory_mb: int = 1024  # RLIMIT_AS of each process
    output_bytes: int = 1 << 16  # stdout and stderr together; more kills the program
    processes: int = 1  # tasks (processes and threads) of the program: RLIMIT_NPROC, pids.max
    file_mb: int = 16  # RLIMIT_FSIZE
    open_files: int = 64  # RLIMIT_NOFILE
    tmpfs_mb: int = 32  # size of the scratch directory and of /tmp (namespaces only)
    cpus: float = 1.0  # CPU time per wall-clock second, across all threads (cgroup cpu.max)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"sandbox limit {name} must be > 0, got {value}")


@dataclass(frozen=True)
class Outcome:
    """How a program ended."""

    passed: bool
    # passed; failed (an exception, or an exit before the end); killed (by a signal: the CPU
    # limit, or the kernel); memory_limit (the out-of-memory killer, in the run's cgroup);
    # timeout (the wall-clock limit); output_limit
    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    # the encoded value of each "eval" step and each answer of a "serve" step, in order
    # (tagged literals, see `_sandbox_boot`); written by the program's process, so data to
    # parse strictly, never to trust
    values: tuple[str, ...] = ()
    # the most memory the run's control group held at once (MiB); None without cgroups
    memory_peak_mb: float | None = None
    # this is a second run (beside only other re-runs) of a program whose first run timed out
    reran: bool = False


Steps = Sequence[tuple[str, ...]]


@dataclass(frozen=True)
class Conversation:
    """Two runs side by side that talk only through the grader: the program's run, whose
    "serve" step answers calls of the program's function, and the judge's run, which holds no
    program and whose "ask" step sends each call's arguments and waits for the answer. Each
    record either side writes passes `check` (which raises on one that is not a value) before
    it reaches the other; the judge's run decides the verdict."""

    program: Steps
    judge: Steps
    check: Callable[[str], object]


@cache
def _boot_source() -> str:
    return Path(__file__).with_name("_sandbox_boot.py").read_text(encoding="utf-8")


def _command() -> list[str]:
    flags = ["-S", "-s", "-B"] + (["-P"] if sys.version_info >= (3, 11) else [])
    return [sys.executable, *flags, "-c", _boot_source()]


# the numeric libraries start one thread each (a program may have one task: `Limits.processes`)
THREADS_ONE = dict.fromkeys(
    (
        "OPENBLAS_NUM_THREADS",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "BLIS_NUM_THREADS",
    ),
    "1",
)
ENV = {
    **THREADS_ONE,
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "HOME": "/",
}


# isolation "process" needs a mount namespace; tests turn this off to see it refuse
MOUNT_NAMESPACE = True


def site_packages() -> list[str]:
    """The site-packages folders of the environment running dllmbench (a virtual environment's
    own, and the base interpreter's where the environment includes them): the packages a
    sandboxed program may import."""
    import site

    return [p for p in dict.fromkeys(site.getsitepackages()) if os.path.isdir(p)]


@cache
def hidden_paths() -> tuple[str, ...]:
    """Real paths of dllmbench's own package folders (its code and the packaged task data) and
    of its installed metadata: never visible to a sandboxed program, whichever way dllmbench is
    installed (a bind of the interpreter's prefix or of site-packages may hold them)."""
    import importlib.util

    found = []
    for name in ("dllmbench", "dllmbench.tasks", "dllmbench.plugins"):
        spec = importlib.util.find_spec(name)
        if spec is not None:
            found += list(spec.submodule_search_locations or ())
    for folder in site_packages():
        for entry in os.listdir(folder):
            if entry.startswith("dllmbench-") and entry.endswith((".dist-info", ".egg-info")):
                found.append(os.path.join(folder, entry))
    return tuple(dict.fromkeys(os.path.realpath(p) for p in found if os.path.isdir(p)))


class Sandbox:
    """Runs programs under `limits` with the chosen isolation; thread-safe. `hide` names more
    folders no program may see (as dllmbench's own package and data never are)."""

    def __init__(
        self, limits: Limits | None = None, isolation: str = "namespaces", hide: Sequence[str] = ()
    ):
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        self.limits = limits or Limits()
        self.isolation = isolation
        self.hide = tuple(dict.fromkeys(os.path.realpath(p) for p in hide))

    def run(
        self,
        steps: Steps,
        feed: int | None = None,
        on_record: Callable[[str | None], None] | None = None,
    ) -> Outcome:
        """Run (name, source) steps in order, in one namespace; pass when all complete.

        A step (name, source, "eval") is an expression: its value is encoded (builtin values,
        see `_sandbox_boot._encode`) and comes back in `Outcome.values`, for the caller to
        judge outside. `feed` is the read end of a pipe the run's "serve" or "ask" step reads
        records from (closed here); `on_record` is called with each record of the values pipe
        as it arrives."""
        # As root the program runs as a uid no other run holds, in either isolation; otherwise
        # it keeps this process's uid, with no capabilities (see `_sandbox_boot`).
        try:
            with allocate_uid() if os.geteuid() == 0 else contextlib.nullcontext() as uid:
                return self._run(steps, uid, feed, on_record)
        except BaseException:
            if feed is not None:
                with contextlib.suppress(OSError):
                    os.close(feed)
            raise

    def converse(self, talk: Conversation) -> Outcome:
        """Run a conversation (see `Conversation`): the program's outcome with the judge's
        verdict. A program that fails, or answers a call that was not made or with a record
        that is not a value, fails; a judge that times out is a timeout, any other way it
        fails makes the program `wrong`."""
        to_program, to_judge = os.pipe(), os.pipe()
        program_in, judge_in = _Relay(to_program[1]), _Relay(to_judge[1])
        asked = [0]  # calls the judge made that the program has not answered
        lock = threading.Lock()

        def from_judge(record: str | None) -> None:
            try:
                if record is None:
                    raise ValueError("a malformed record")
                talk.check(record)
            except Exception:
                program_in.close()
                return
            with lock:
                asked[0] += 1
            program_in.send(record)

        def from_program(record: str | None) -> None:
            with lock:
                unasked = asked[0] == 0
                asked[0] -= 1
            try:
                if record is None or unasked:
                    raise ValueError("a malformed record, or an answer to no call")
                talk.check(record)
            except Exception:
                judge_in.close()
                return
            judge_in.send(record)

        judged: list[Outcome] = []

        def judge() -> None:
            try:
                judged.append(self.run(talk.judge, to_judge[0], from_judge))
            finally:
                program_in.close()

        thread = threading.Thread(target=judge, name="sandbox-judge", daemon=True)
        thread.start()
        try:
            outcome = self.run(talk.program, to_program[0], from_program)
        finally:
            judge_in.close()
            thread.join()
        if not judged:  # the judge's run raised (it could not start): so does this
            raise UserError("the code sandbox could not run a judge beside a program")
        verdict = judged[0]
        if not outcome.passed or verdict.passed:
            return outcome
        status = "timeout" if verdict.status == "timeout" else "wrong"
        return replace(outcome, passed=False, status=status)

    def run_many(self, programs: Sequence[Steps | Conversation], workers: int = 0) -> list[Outcome]:
        """Run many programs, `workers` at a time (0: two per CPU core, as a run spends part
        of its time waiting on the kernel). Programs that timed out beside others are run
        again, once, side by side with only each other (`workers` at a time), and that second
        outcome counts (`Outcome.reran`): a neighbour's load must not fail a correct program,
        and N programs that wait until their timeout cost about one timeout more, not N. (A
        program that only burns CPU ends on its CPU-seconds limit, not on the clock.)"""
        workers = max(1, workers or 2 * (os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            outcomes = list(pool.map(self._one, programs))
            if workers > 1 and len(programs) > 1:
                again = [i for i, outcome in enumerate(outcomes) if outcome.status == "timeout"]
                reruns = pool.map(self._one, [programs[i] for i in again])
                for i, outcome in zip(again, reruns, strict=True):
                    outcomes[i] = replace(outcome, reran=True)
        return outcomes

    def _one(self, program: Steps | Conversation) -> Outcome:
        return self.converse(program) if isinstance(program, Conversation) else self.run(program)

    def _run(
        self,
        steps: Steps,
        uid: int | None,
        feed: int | None = None,
        on_record: Callable[[str | None], None] | None = None,
    ) -> Outcome:
        limits = self.limits
        nonce = secrets.token_hex(16)
        status_r, status_w = os.pipe()
        values_r, values_w = os.pipe()
        passed_fds = (status_w, values_w) if feed is None else (status_w, values_w, feed)
        request = {
            **asdict(limits),
            "steps": [list(s) for s in steps],
            "nonce": nonce,
            "isolation": self.isolation,
            "status_fd": status_w,
            "values_fd": values_w,
            "calls_fd": feed,
            "uid": uid,
            "site_packages": site_packages(),
            "hidden": [*hidden_paths(), *self.hide],
            "mount_namespace": MOUNT_NAMESPACE,
        }
        group = RunGroup.create(
            limits.memory_mb,
            limits.processes + (2 if self.isolation == "namespaces" else 0),  # + boot and init
            limits.cpus,
        )
        start = time.monotonic()
        deadline = start + limits.timeout
        try:
            proc = subprocess.Popen(
                _command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=passed_fds,
                start_new_session=True,
                cwd="/",
                env=ENV,
            )
        except BaseException:
            os.close(status_r)
            os.close(values_r)
            if group is not None:
                group.remove()
            raise
        finally:
            for fd in passed_fds:
                os.close(fd)
        try:
            if group is not None:  # it waits for the request on stdin: nothing has run yet
                group.add(proc.pid)
            out, err, status, values, reason = _exchange(
                proc,
                marshal.dumps(request),
                (status_r, values_r),
                deadline,
                limits.output_bytes,
                on_record,
            )
        finally:
            os.close(status_r)
            os.close(values_r)
            if group is not None:
                group.kill()
            _end(proc)
        peak, ooms = None, 0
        if group is not None:
            peak, ooms = group.memory_peak(), group.oom_kills()
            group.remove()
        seconds = time.monotonic() - start
        ready = status.startswith(b"ready")
        if not ready and reason is None:
            message = status.decode(errors="replace").strip() or err.decode(errors="replace")
            message = message.strip()[-300:].replace("\n", " ") or "no message"
            if self.isolation == "process":
                raise UserError(f"the code sandbox (isolation=process) could not start: {message}")
            raise UserError(
                f"the code sandbox could not start ({message}); "
                "it needs Linux namespaces (root, or unprivileged user namespaces enabled); "
                "isolation=process runs programs without them, with far weaker protection"
            )
        marker = f"\n{nonce}\n".encode()
        passed = reason is None and proc.returncode == 0 and out.endswith(marker)
        if passed:
            out = out[: -len(marker)]
        killed = proc.returncode is not None and (proc.returncode < 0 or proc.returncode > 128)
        if passed:
            status_name = "passed"
        elif reason is None and ooms:
            status_name = "memory_limit"
        else:
            status_name = reason or ("killed" if killed else "failed")
        return Outcome(
            passed,
            status_name,
            proc.returncode,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            seconds,
            _records(values),
            None if peak is None else peak / (1 << 20),
        )


_uids_lock = threading.Lock()
_uids_in_use: set[int] = set()


@contextlib.contextmanager
def allocate_uid(
    directory: Path = UID_LOCKS, base: int = UID_BASE, span: int = UID_SPAN
) -> Iterator[int]:
    """Hold a uid of base..base+span-1 that no other live run holds, until the block ends.

    Within this process a set of the uids in use (under a lock); across processes an exclusive
    flock on `directory`/<uid>, held for the block and released when its descriptor closes (also
    when the process dies). Lock files are never deleted, so two processes always lock the same
    file. Tries uids from a random one onwards, skipping those held."""
    _private_folder(directory)
    start = secrets.randbelow(span)
    with _uids_lock:
        for i in range(span):
            uid = base + (start + i) % span
            if uid in _uids_in_use:
                continue
            fd = os.open(
                directory / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            _uids_in_use.add(uid)
            break
        else:
            raise RuntimeError(f"no free uid: all {span} from {base} are held by running programs")
    try:
        yield uid
    finally:
        os.close(fd)  # releases the flock
        with _uids_lock:
            _uids_in_use.discard(uid)


def _private_folder(directory: Path) -> None:
    """Create `directory` (0700) if needed; refuse one that others own or could write to."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise UserError(
            f"{directory} must be a folder owned by this user that others cannot write to"
        )


class _Relay:
    """The write end of a pipe into a run, fed records by a thread of its own, so that the
    reader of the other run's pipes never blocks on this one."""

    def __init__(self, fd: int):
        self._fd = fd
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._write, name="sandbox-relay", daemon=True)
        self._thread.start()

    def send(self, record: str) -> None:
        data = record.encode("utf-8", "surrogatepass")
        self._queue.put(b"%d\n" % len(data) + data)

    def close(self) -> None:
        """No more records: the reader sees the end once those sent are written."""
        self._queue.put(None)

    def _write(self) -> None:
        try:
            while (data := self._queue.get()) is not None:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
        except OSError:  # the reader is gone
            pass
        finally:
            os.close(self._fd)


def _records(data: bytes) -> tuple[str, ...]:
    """The length-prefixed records of the values pipe (`<length>\\n<bytes>` each); reading stops
    at the first malformed one, so a caller that counts them sees the damage."""
    return _parse(data)[0]


def _parse(data: bytes | bytearray, at: int = 0) -> tuple[tuple[str, ...], int, bool]:
    """The whole records of `data` from `at`, where the first one not whole begins, and
    whether that one is malformed (rather than cut short)."""
    out = []
    while at < len(data):
        newline = data.find(b"\n", at, at + 12)
        head = data[at:newline] if newline >= 0 else data[at : at + 12]
        if not head.isdigit():
            return tuple(out), at, bool(head) and (newline >= 0 or len(head) == 12)
        if newline < 0:
            break
        end = newline + 1 + int(head)
        if end > len(data):
            break
        try:
            out.append(data[newline + 1 : end].decode("utf-8"))
        except UnicodeDecodeError:
            return tuple(out), at, True
        at = end
    return tuple(out), at, False


def _exchange(
    proc: subprocess.Popen,
    request: bytes,
    pipes: tuple[int, int],
    deadline: float,
    cap: int,
    on_record: Callable[[str | None], None] | None = None,
) -> tuple[bytes, bytes, bytes, bytes, str | None]:
    """Write the request, then read stdout, stderr, the status and the values pipes until all
    close, the deadline passes or the output its cap (the values count towards it); wait for
    the exit. Never blocks past the deadline. `on_record` is called with each whole record of
    the values pipe as it arrives, and once with None at a malformed one (then no more)."""
    status_r, values_r = pipes
    parsed, streaming = 0, on_record is not None
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdin, stdout, stderr = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
    received = {fd: bytearray() for fd in (stdout, stderr, status_r, values_r)}
    os.set_blocking(stdin, False)
    pending = memoryview(request)
    total, reason = 0, None
    with selectors.DefaultSelector() as selector:  # epoll: no limit on descriptor numbers
        selector.register(stdin, selectors.EVENT_WRITE)
        for fd in received:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and reason is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "timeout"
                break
            for key, _ in selector.select(remaining):
                fd = key.fd
                if fd == stdin:
                    try:
                        pending = pending[os.write(stdin, pending) :]
                    except BlockingIOError:
                        continue
                    except OSError:
                        pending = pending[:0]  # it died before reading: reported later
                    if not pending:
                        selector.unregister(stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    selector.unregister(fd)
                    continue
                if fd != status_r:
                    total += len(chunk)
                    if total > cap:
                        reason = "output_limit"
                received[fd] += chunk[: max(0, cap + 64 - len(received[fd]))]
                if fd == values_r and len(received[fd]) > cap:
                    reason = "output_limit"
                if fd == values_r and streaming and on_record is not None:
                    records, parsed, broken = _parse(received[fd], parsed)
                    for record in records:
                        on_record(record)
                    if broken:
                        on_record(None)
                        streaming = False
    while reason is None and not _exited(proc.pid):  # pipes closed: wait for the exit
        if time.monotonic() >= deadline:
            reason = "timeout"
        time.sleep(0.002)
    out, err, status, values = (bytes(received[fd]) for fd in (stdout, stderr, status_r, values_r))
    return out, err, status, values, reason


def _exited(pid: int) -> bool:
    """Whether the process has exited, without reaping it (its pid keeps the group's id)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _end(proc: subprocess.Popen) -> None:
    """Kill the program's process group (whatever is left of it), then reap its first process.

    The first process is reaped only after the kill, so the group id cannot have been reused.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
