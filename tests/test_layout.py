"""The layout's rules, checked on the code: layers import downwards only.

``dash_ref`` imports neither ``dash_cuda`` nor ``verify``; ``dash_cuda`` does not import
``verify``; a backend imports ``dash_ref`` and shared ``dash_cuda`` parts, never another
backend; no package imports ``docs``, ``benchmarks``, ``scripts`` or ``tests``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dash_ref", "dash_cuda", "verify")
NOT_INSTALLED = ("docs", "benchmarks", "scripts", "tests")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_a_higher_layer_or_an_uninstalled_folder(package):
    higher = {"dash_ref": {"dash_cuda", "verify"}, "dash_cuda": {"verify"}, "verify": set()}
    for path in sources(package):
        bad = {n for n in imports(path) if top(n) in higher[package] | set(NOT_INSTALLED)}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_backends_import_only_shared_parts_and_dash_ref():
    backends = ROOT / "dash_cuda" / "backends"
    names = {p.name for p in backends.iterdir() if (p / "__init__.py").exists()}
    assert names == {"triton", "cute"}
    for name in names:
        for path in sorted((backends / name).rglob("*.py")):
            for imported in imports(path):
                if imported.startswith("dash_cuda.backends."):
                    other = imported.split(".")[2]  # a name of the interface, or a backend
                    assert other == name or other not in names, (
                        f"{path.relative_to(ROOT)} imports the backend {imported}")
                assert not imported.startswith(("dash_cuda.api", "dash_cuda.checks")), (
                    f"{path.relative_to(ROOT)} imports {imported}")


def test_importing_the_packages_loads_no_kernel_compiler():
    code = ("import sys, dash_ref, dash_cuda, verify, verify.cli\n"
            "import dash_cuda.backends.triton, dash_cuda.backends.triton.contract\n"
            "assert 'triton' not in sys.modules and 'cutlass' not in sys.modules\n")
    import subprocess

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
