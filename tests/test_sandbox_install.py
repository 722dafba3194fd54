"""Nothing of dllmbench (its code, its packaged task data and answers, its metadata) is
readable inside the sandbox, however dllmbench is installed: here a wheel built from this
checkout and installed into a fresh prefix, its site-packages shown to programs as the
environment's site-packages ("venv") or as part of a whole prefix the sandbox binds
("prefix": a system, /usr/local or conda install, where the interpreter's prefix holds it),
in both isolations. A module installed beside it shows that programs do see that folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PIP = (sys.executable, "-m", "pip")

# run by the grader's process: dllmbench from the wheel's prefix, the sandbox shown `shown`
GRADER = """
import json, sys
import dllmbench
from dllmbench.tasks import sandbox
site, shown, isolation, program = sys.argv[1:5]
assert dllmbench.__file__.startswith(site), dllmbench.__file__
sandbox.site_packages = lambda: [shown] if shown == site else [site, shown]
outcome = sandbox.Sandbox(sandbox.Limits(timeout=30), isolation).run([("program", program)])
print(json.dumps({"passed": outcome.passed, "stdout": outcome.stdout, "stderr": outcome.stderr,
                  "hidden": list(sandbox.hidden_paths())}))
"""

# looks for every file of the installed package, by every name under the prefix
PROBE = """
import os, sys
import probe_beside  # the folder dllmbench is installed in is on the path and readable
print("beside", probe_beside.VALUE)
read, seen = [], 0


def attempt(path):
    try:
        with open(path, "rb") as fh:
            fh.read(1)
        read.append(path)
    except OSError:
        pass


for folder, dirs, files in os.walk(PREFIX):
    for name in files:
        parts = folder.split(os.sep)  # a file of the package or its metadata (not a script)
        if "dllmbench" in parts or any(p.startswith("dllmbench-") for p in parts):
            seen += 1
            attempt(os.path.join(folder, name))
for path in FILES:
    attempt(path)
print("seen", seen)
print("read", read)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of this checkout (its tracked and new files), built without the network."""
    source = tmp_path_factory.mktemp("source")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [*PIP, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("dllmbench-*.whl")
    return built


@pytest.fixture(scope="module")
def prefix(wheel, tmp_path_factory) -> tuple[Path, Path]:
    """(prefix, its site-packages) with the wheel and a module beside it installed."""
    root = tmp_path_factory.mktemp("prefix")
    root.chmod(0o755)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(root), "platbase": str(root)}))
    # --target, not --prefix: pip would uninstall the dllmbench of the running environment
    subprocess.run(
        [*PIP, "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    assert (site / "dllmbench" / "tasks" / "packaged" / "mbpp" / "mbpp.jsonl.gz").is_file()
    (site / "probe_beside.py").write_text("VALUE = 42\n")
    for folder, dirs, files in os.walk(root):  # readable by the sandbox's unprivileged uid
        for name in dirs + files:
            os.chmod(os.path.join(folder, name), 0o755)
    return root, site


@pytest.mark.parametrize("layout", ["venv", "prefix"])
@pytest.mark.parametrize("isolation", ["namespaces", "process"])
def test_no_file_of_an_installed_dllmbench_is_readable_inside(prefix, layout, isolation):
    root, site = prefix
    package = site / "dllmbench"
    files = [
        package / "tasks" / "packaged" / "mbpp" / "mbpp.jsonl.gz",
        package / "tasks" / "mbpp.py",
        package / "__init__.py",
        *site.glob("dllmbench-*.dist-info/RECORD"),
    ]
    assert all(f.is_file() for f in files)
    shown = str(site) if layout == "venv" else str(root)
    program = PROBE.replace("PREFIX", repr(str(root))).replace(
        "FILES", repr([str(f) for f in files])
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-c", GRADER, str(site), shown, isolation, program],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert str(package) in outcome["hidden"]
    assert outcome["passed"], outcome
    lines = outcome["stdout"].splitlines()
    assert "beside 42" in lines  # the folder is there for programs …
    assert "read []" in lines, lines  # … but not one file of dllmbench
