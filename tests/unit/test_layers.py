"""The house's layers: each package imports only from the packages below it, so no import climbs back up.

The picture, bottom to top: the contracts (the wire format) import nothing of Castad's; the runtime builds on
the contracts; each service and the command line build on those two and never on each other (the saga moves by
events, not calls); the local tooling wires every service together; the test kit, the fault harness and the
benchmarks sit on top (the tests above all), and nothing in the product imports them.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Where each top-level package lives, and which of Castad's packages it may import besides itself.
PRODUCT = {"castad_contracts", "castad_runtime"}
SERVICES = {"castad_api", "castad_relay", "castad_lyric", "castad_song", "castad_video"}
BELOW: dict[str, set[str]] = {
    "castad_contracts": set(),
    "castad_runtime": {"castad_contracts"},
    "castad_cli": {"castad_contracts"},
    **{service: PRODUCT for service in SERVICES},
    "castad_local": PRODUCT | SERVICES | {"castad_cli"},
    "castad_testkit": PRODUCT | {"castad_local"},
    "castad_faults": PRODUCT | SERVICES | {"castad_local", "castad_testkit"},
}
CASTAD = set(BELOW) | {"bench", "tests"}


def _package_roots() -> dict[str, pathlib.Path]:
    """Return each package's folder, found by its name under libs/, services/ and infra/, and the benchmarks'."""
    roots = {"bench": ROOT / "bench"}
    for parent in ("libs", "services", "infra"):
        for folder in (ROOT / parent).glob("*/castad_*"):
            if (folder / "__init__.py").is_file():
                roots[folder.name] = folder
    return roots


def _imported(path: pathlib.Path) -> set[str]:
    """Return the top-level names a module imports, wherever the import statement stands (lazy ones too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_package_has_its_place_in_the_picture() -> None:
    assert set(_package_roots()) == set(BELOW) | {"bench"}


def test_the_benchmarks_import_anything_but_the_tests() -> None:
    reaching = {f"{path.relative_to(ROOT)}" for path in (ROOT / "bench").rglob("*.py") if "tests" in _imported(path)}
    assert not reaching, sorted(reaching)


@pytest.mark.parametrize("package", sorted(BELOW))
def test_a_package_imports_only_from_the_layers_below_it(package: str) -> None:
    allowed = BELOW[package] | {package}
    climbing = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _package_roots()[package].rglob("*.py")
        for name in _imported(path) & CASTAD
        if name not in allowed
    }
    assert not climbing, sorted(climbing)
