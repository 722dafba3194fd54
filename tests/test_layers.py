"""The house's plan, checked: harness/ is grouped in layers, and a module imports only from its
own layer or the layers below it (docs/architecture.md, "Layers"). Plugins and tasks import the
plugin API and the kernel, never the machinery that runs them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "harness"

# Bottom to top. A module of layer i may import from layers 0..i.
LAYERS = (
    "core",
    "api",
    "loading",
    "execution",
    "storage",
    "analysis",
    "running",
    "scoring",
    "demo",
    "cli",
    "testing",
)
# What a built-in plugin or task may import of the harness: the plugin API, the kernel and the
# demo's folder (the tiny backbone loads its weights from there).
PLUGIN_MAY_IMPORT = ("core", "api", "demo")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import of dllmbench in a file, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "dllmbench":
                names = [a.name for a in node.names if not a.name.startswith("__")]
                found += [(node.lineno, f"dllmbench.{name}") for name in names]
            elif node.module.startswith("dllmbench."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import; write it absolute")
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("dllmbench.")]
    return found


def _layer_of(module: str) -> str | None:
    """The layer a dllmbench module belongs to (None: the package root or a stable alias)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _harness_modules() -> list[Path]:
    return sorted(p for p in HARNESS.rglob("*.py") if "tiny_model" not in p.parts)


def test_the_check_sees_lazy_and_package_imports(tmp_path: Path):
    source = tmp_path / "m.py"
    source.write_text(
        "from dllmbench import __version__\n"
        "from dllmbench import cli\n"
        "def f():\n"
        "    import dllmbench.running.runner\n"
        "    from dllmbench.analysis.stats import CONFIDENCE\n"
    )
    assert [m for _, m in _imports(source)] == [
        "dllmbench.cli",
        "dllmbench.running.runner",
        "dllmbench.analysis.stats",
    ]


def test_every_harness_module_sits_in_a_layer():
    loose = [p.name for p in HARNESS.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert not loose, f"modules outside a layer subpackage: {loose}"
    packages = {p.name for p in HARNESS.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS), packages ^ set(LAYERS)


@pytest.mark.parametrize("path", _harness_modules(), ids=lambda p: str(p.relative_to(HARNESS)))
def test_a_module_imports_only_its_layer_and_below(path: Path):
    relative = path.relative_to(HARNESS)
    if len(relative.parts) == 1:
        return  # the package root (__init__, __main__) may name any layer
    mine = LAYERS.index(relative.parts[0])
    for line, module in _imports(path):
        assert not module.startswith(("dllmbench.plugins", "dllmbench.tasks")), (
            f"{relative}:{line} imports the built-in plugin {module}; the core finds plugins "
            "only through the registry"
        )
        layer = _layer_of(module)
        assert layer is not None, f"{relative}:{line} imports {module}: name the layered module"
        assert LAYERS.index(layer) <= mine, (
            f"{relative}:{line} ({LAYERS[mine]}) imports {module} ({layer}), a layer above it"
        )


@pytest.mark.parametrize(
    "path",
    sorted([*(ROOT / "plugins").rglob("*.py"), *(ROOT / "tasks").rglob("*.py")]),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_plugins_import_only_the_plugin_api_and_the_kernel(path: Path):
    for line, module in _imports(path):
        if module.startswith(("dllmbench.plugins", "dllmbench.tasks")):
            continue
        layer = _layer_of(module)
        assert layer in PLUGIN_MAY_IMPORT, (
            f"{path.relative_to(ROOT)}:{line} imports {module}; a plugin imports only "
            f"{', '.join('dllmbench.' + name for name in PLUGIN_MAY_IMPORT)}"
        )
