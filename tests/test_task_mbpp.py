"""mbpp: program extraction, prompts, every reference solution through the sandbox, and
hostile programs that must end as failed grades with the host, this process and the run intact.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dllmbench.core.errors import UserError
from dllmbench.tasks import sandbox as module
from dllmbench.tasks.data import PACKAGED
from dllmbench.tasks.mbpp import FEWSHOT_IDS, Mbpp, extract_program, program_key
from dllmbench.tasks.sandbox import Limits, Sandbox, site_packages

DATA = PACKAGED  # the copy shipped with dllmbench, named explicitly ($DLLMBENCH_DATA aside)
# the one reference known to fail: task 123 sums amicable numbers below 9999 by trial
# division, about 6 CPU seconds here, past the 5-second CPU limit
SLOW_REFERENCES = {"123"}


@pytest.fixture(scope="module")
def task() -> Mbpp:
    return Mbpp(data=str(DATA))


EXTRACT = [
    ("```python\ndef f(x):\n    return x\n```", "def f(x):\n    return x"),
    ("Sure:\n```\ndef f(): pass\n```\nUsage:\n```python\nprint(f())\n```", "def f(): pass"),
    ("```python\nprint(1)\n```\ntext\n```python\ndef g(): pass\n```", "def g(): pass"),
    ("```Python\nimport re\n```", "import re"),
    ("```python\ndef f(x):\n    return x", "def f(x):\n    return x"),  # cut off
    ("def f(x):\n    return x\n[DONE]\nYou are an expert", "def f(x):\n    return x"),
    ("[BEGIN]\ndef f(): pass\n[DONE]", "def f(): pass"),
    ("def f(): pass", "def f(): pass"),
    ("```python\n```", None),
    ("   \n", None),
    ("", None),
]


@pytest.mark.parametrize("text,expected", EXTRACT)
def test_extract_program(text, expected):
    assert extract_program(text) == expected


def test_program_keys():
    assert program_key("def f(x):\n  return x  # note\n") == program_key("def f(x):\n    return x")
    assert program_key("def f(x): return x") != program_key("def f(x): return -x")
    assert program_key("def f(:") == program_key("def f(:  ") != program_key("def g(:")


def test_prompts(task):
    problem = task.problems("test")[0]
    chat = task.prompt(problem, "chat").messages[0]["content"]
    assert problem.question in chat and all(t in chat for t in problem.meta["tests"])
    text = task.prompt(problem, "fewshot").text
    assert text.count("[BEGIN]") == 4 and text.count("[DONE]") == 3 and text.endswith("[BEGIN]\n")
    prompt_split = {p.id: p for p in task.problems("prompt")}
    for i in FEWSHOT_IDS:
        assert prompt_split[str(i)].gold.reference.strip() in text
    assert "\r" not in text


@pytest.mark.slow
def test_every_reference_solution_is_graded(task):
    problems = [p for split in task.splits() for p in task.problems(split)]
    assert len(problems) == 974
    start = time.monotonic()
    grades = task.grade_many([(p, p.gold.reference, "") for p in problems])
    seconds = time.monotonic() - start
    failed = {
        p.id: task.run(p, p.gold.reference)
        for p, ok in zip(problems, grades, strict=True)
        if not ok
    }
    print(
        f"\nMBPP references: {sum(grades)}/974 pass, {974 / seconds:.1f} programs/s "
        f"on {os.cpu_count()} cores; failed: "
        + ", ".join(f"{pid} ({o.status}, {o.seconds:.1f}s)" for pid, o in failed.items())
    )
    assert sum(grades) >= 0.97 * 974
    assert set(failed) <= SLOW_REFERENCES, {k: v.stderr[-300:] for k, v in failed.items()}
    # a wrong program fails, and the same program twice is graded once
    problem = problems[20]
    assert not task.grade(problem, "def nothing(): pass", "")
    assert task.grade(problem, problem.gold.reference, "")


def test_setup_code_runs_between_program_and_asserts(task):
    problem = next(p for p in task.problems("test") if p.gold.setup.strip())
    assert task.run(problem, problem.gold.reference).passed
    steps = task.steps(problem, "x = 1")
    assert [step[0] for step in steps][:3] == ["program", "setup", "test 1"]
    assert steps[2][2] == "eval"  # the actual side only: its value is judged outside


LIBC = "import ctypes, os, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def _connect(port: int) -> str:
    """A raw connect to 127.0.0.1:port through libc, past the audit hook."""
    return LIBC + (
        "fd = libc.socket(2, 1, 0)\n"
        f"addr = struct.pack('=H', 2) + struct.pack('!H', {port}) + bytes([127, 0, 0, 1])\n"
        "addr += bytes(8)\n"
        "rc = libc.connect(fd, addr, len(addr))\n"
        "print('connect', rc, os.strerror(ctypes.get_errno()), flush=True)\n"
        "assert rc == 0\n"
    )


def _hostile(victim: Path, probe: str, port: int, bystander: int) -> dict[str, str]:
    """Hostile programs; the processes they attack are this test's own (this process and
    `bystander`, a process it started), never others of the machine."""
    me = os.getpid()
    return {
        "loop": "while True:\n    pass",
        "sleep": "import time\nwhile True:\n    time.sleep(1)",
        "fork_bomb": "import os\nwhile True:\n    os.fork()",
        "fork_bomb_libc": LIBC + "while True:\n    libc.fork()",
        "memory_bomb": "x = []\nwhile True:\n    x.append(bytearray(10**7))",
        "memory_bomb_fast": "x = bytearray(10**11)",
        "delete_file": f"import os, shutil\nos.remove({str(victim)!r})",
        "delete_tree": f"import shutil\nshutil.rmtree({str(victim.parent)!r})",
        "write_outside": f"open({probe!r}, 'w').write('x')",
        "connect": f"import socket\nsocket.socket().connect(('127.0.0.1', {port}))",
        "connect_by_name": f"import socket\nsocket.create_connection(('localhost', {port}))",
        "connect_libc": _connect(port),
        "output_flood": "while True:\n    print('x' * 10000)",
        "sys_exit": "import sys\nsys.exit(0)",
        "os_exit": "import os\nos._exit(0)",
        "kill_parent": f"import os, signal\nos.kill({me}, signal.SIGKILL)",
        "kill_parent_libc": LIBC
        + f"print([libc.kill(pid, 9) for pid in ({me}, os.getppid(), {bystander})], flush=True)\n"
        + "libc.kill(0, 9)\nassert False",
        "kill_group": "import os, signal\nos.killpg(0, signal.SIGKILL)",
    }


def _stray_sandboxes() -> list[int]:
    """Processes still running the sandbox's child code."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"The sandbox's child side" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["namespaces", "process"])
def test_hostile_programs_fail_and_leave_everything_intact(tmp_path, isolation):
    limits = Limits(timeout=4.0, cpu_seconds=2, memory_mb=512, output_bytes=1 << 15)
    sandbox = Sandbox(limits, isolation)
    folder = tmp_path / "victims"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)  # writable by anyone: only the sandbox keeps it safe
    victim = folder / "precious.txt"
    victim.write_text("keep me")
    victim.chmod(0o666)
    probe = f"/etc/dllmbench-sandbox-probe-{os.getpid()}"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    bystander = subprocess.Popen(["sleep", "120"])
    programs = _hostile(victim, probe, port, bystander.pid)
    try:
        start = time.monotonic()
        outcomes = dict(
            zip(
                programs,
                sandbox.run_many([[("program", s)] for s in programs.values()], 4),
                strict=True,
            )
        )
        elapsed = time.monotonic() - start
    finally:
        written = Path(probe).exists()
        if written:
            Path(probe).unlink()
        alive = bystander.poll() is None
        bystander.kill()
        bystander.wait()
    for name, outcome in outcomes.items():
        assert not outcome.passed, (name, outcome)
        assert outcome.seconds < limits.timeout + 1.5, (name, outcome.seconds)
    assert outcomes["loop"].status in ("killed", "timeout")
    assert outcomes["sleep"].status == "timeout"
    assert outcomes["output_flood"].status == "output_limit"
    assert len(outcomes["output_flood"].stdout) <= limits.output_bytes + 64
    assert "MemoryError" in outcomes["memory_bomb"].stderr
    assert "refuses socket.__new__" in outcomes["connect"].stderr
    assert "refuses os.fork" in outcomes["fork_bomb"].stderr
    assert "refuses os.kill" in outcomes["kill_parent"].stderr
    assert elapsed < 4 * (limits.timeout + 1.5)
    # the host is intact: files, this process, the network, no program left running
    assert victim.read_text() == "keep me" and not written
    assert alive, "a program killed a process outside its sandbox"
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
    os.kill(os.getpid(), 0)
    for _ in range(50):
        if not _stray_sandboxes():
            break
        time.sleep(0.1)
    assert _stray_sandboxes() == []
    # and the run goes on: a good program still passes, a wrong one still fails
    assert sandbox.run(
        [("program", "def f(x):\n    return x + 1"), ("test", "assert f(1) == 2")]
    ).passed
    assert not sandbox.run(
        [("program", "def f(x):\n    return x"), ("test", "assert f(1) == 2")]
    ).passed


def test_hostile_programs_as_mbpp_answers(task):
    problem = task.problems("test")[0]
    answers = [
        "import os\nos._exit(0)",
        "import sys\nsys.exit(0)",
        problem.gold.reference + "\nimport os\nos._exit(0)",
        "```python\n" + problem.gold.reference + "\n```",
    ]
    grades = task.grade_many([(problem, a, a) for a in answers])
    assert grades == [False, False, False, False]  # the last is raw text with fences
    assert task.grade(problem, task.extract(answers[-1]), answers[-1])


CHECKOUT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_namespaces_sandbox_hides_the_host():
    outcome = Sandbox(Limits(timeout=10)).run(
        [
            (
                "program",
                "import os\n"
                "print(sorted(os.listdir('/')))\n"
                "print(os.getcwd(), sorted(os.listdir('/proc'))[:3])\n"
                "print([l.split(':')[0].strip() for l in open('/proc/net/dev') if ':' in l])\n"
                "print(os.geteuid() == 0 or os.geteuid() >= 40000)\n"
                f"print(os.path.exists({str(DATA)!r}), os.path.exists({str(CHECKOUT)!r}))\n",
            )
        ]
    )
    assert outcome.passed, outcome
    lines = outcome.stdout.splitlines()
    # the system and interpreter folders, the site-packages of the environment running
    # dllmbench (under whatever top folder it lives: only the path down to it is shown)
    shown = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "scratch"}
    shown |= {"tmp", "usr", "var"}
    shown |= {Path(p).parts[1] for p in (sys.prefix, sys.base_prefix, *site_packages())}
    assert "scratch" in lines[0] and set(eval(lines[0])) <= shown, lines[0]
    assert lines[1].startswith("/scratch ['1', ")  # its own PID namespace: it is process 1
    assert lines[2] == "['lo']"  # no network interface but the loopback (down)
    assert lines[3] == "True"
    assert lines[4] == "False False"  # neither the data nor the checkout is visible


def test_grade_is_deterministic_across_runs():
    program = "s = {'apple', 'pear', 'fig', 'kiwi', 'lime'}\nprint(list(s))"
    sandbox = Sandbox(Limits(timeout=10))
    first, second = (sandbox.run([("program", program)]).stdout for _ in range(2))
    assert first == second  # a fixed hash seed: set order repeats


def test_signals_are_reported():
    outcome = Sandbox(Limits(timeout=10)).run([("program", "import os\nos.abort()")])
    assert outcome.status == "killed" and outcome.exit_code == 128 + signal.SIGABRT


def test_a_sandbox_that_cannot_start_is_a_user_error(monkeypatch):
    fake = (
        "import marshal, os, sys\n"
        "request = marshal.loads(sys.stdin.buffer.read())\n"
        "os.write(request['status_fd'], b'error: unshare: Operation not permitted\\n')\n"
    )
    monkeypatch.setattr(module, "_command", lambda: [sys.executable, "-c", fake])
    with pytest.raises(UserError, match=r"unshare: Operation not permitted.*isolation=process"):
        Sandbox().run([("program", "pass")])


def test_problems_are_hashable(task):
    problem = task.problems("test")[0]
    assert hash(problem) == hash(task.problems("test")[0])
    assert problem.gold.asserts == tuple(problem.meta["tests"])


def test_uids_held_at_once_never_collide(tmp_path):
    with contextlib.ExitStack() as stack:
        uids = [stack.enter_context(module.allocate_uid(tmp_path, 1000, 50)) for _ in range(50)]
        assert sorted(uids) == list(range(1000, 1050))
        with pytest.raises(RuntimeError, match="no free uid"):
            stack.enter_context(module.allocate_uid(tmp_path, 1000, 50))


def test_uids_from_threads_never_collide(tmp_path):
    held, errors, barrier = [], [], threading.Barrier(8)

    def draw():
        try:
            with contextlib.ExitStack() as stack:
                for _ in range(20):
                    held.append(stack.enter_context(module.allocate_uid(tmp_path, 1000, 200)))
                barrier.wait(timeout=30)  # every thread holds its 20 at once
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=draw) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(held) == 160 and len(set(held)) == 160


@pytest.mark.slow
def test_a_uid_held_by_another_process_is_skipped(tmp_path):
    with module.allocate_uid(tmp_path, 1000, 1):
        pass  # creates the folder and the lock file
    holder = (
        "import fcntl, sys\n"
        f"f = open({str(tmp_path / '1000')!r}, 'r+')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline() == "held\n"
        for _ in range(20):
            with module.allocate_uid(tmp_path, 1000, 2) as uid:
                assert uid == 1001
        with pytest.raises(RuntimeError, match="no free"), module.allocate_uid(tmp_path, 1000, 1):
            pass
    finally:
        child.communicate()  # closes its stdin: it exits and its lock goes
    with module.allocate_uid(tmp_path, 1000, 1) as uid:
        assert uid == 1000


def test_a_released_uid_is_available_again(tmp_path):
    with pytest.raises(ValueError), module.allocate_uid(tmp_path, 1000, 1) as uid:
        assert uid == 1000
        raise ValueError  # released on an exception too
    with module.allocate_uid(tmp_path, 1000, 1) as uid:
        assert uid == 1000
    assert not module._uids_in_use


def test_uid_folder_others_can_write_is_refused(tmp_path):
    folder = tmp_path / "uids"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    with pytest.raises(UserError, match="cannot write"), module.allocate_uid(folder, 1000, 1):
        pass


def test_concurrent_sandbox_runs_get_distinct_uids(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("uids are allocated only as root")
    seen, inside = [], threading.Barrier(4)
    real = module.allocate_uid

    @contextlib.contextmanager
    def watched():
        with real() as uid:
            seen.append(uid)
            inside.wait(timeout=30)  # all four runs hold their uid at once
            yield uid

    monkeypatch.setattr(module, "allocate_uid", watched)
    outcomes = Sandbox(Limits(timeout=20)).run_many([[("program", "pass")]] * 4, workers=4)
    assert all(o.passed for o in outcomes) and len(set(seen)) == 4
