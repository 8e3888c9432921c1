"""Every docstring of the libraries and services opens with one short line saying what its subject does."""

from __future__ import annotations

import ast
import pathlib

from castad_local import REPO_ROOT

CHECKED = ("libs", "services")
LIMIT = 110  # characters of the opening line's text: with its quotes, it fits on a line of 120 at any usual indent

_Documented = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def opening_problems(source: str, path: str) -> list[str]:
    """`path:line:name: why` for each docstring in `source` whose opening is not one line of at most LIMIT."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, _Documented):
            continue
        docstring = ast.get_docstring(node)
        if not docstring:
            continue
        opening = docstring.split("\n\n", 1)[0]
        where = f"{path}:{getattr(node, 'lineno', 1)}:{getattr(node, 'name', '<module>')}"
        if "\n" in opening:
            problems.append(f"{where}: the opening runs over {opening.count(chr(10)) + 1} lines")
        elif len(opening) > LIMIT:
            problems.append(f"{where}: the opening is {len(opening)} characters, more than {LIMIT}")
    return problems


def checked_files() -> list[pathlib.Path]:
    """The Python files of the libraries and services, but their migrations."""
    files = [path for root in CHECKED for path in sorted((REPO_ROOT / root).rglob("*.py"))]
    return [path for path in files if "migrations" not in path.relative_to(REPO_ROOT).parts]


def test_every_docstring_of_the_libraries_and_services_opens_with_one_short_line():
    files = checked_files()
    assert len(files) > 100, "the libraries and services were not found"
    problems = [
        problem for path in files for problem in opening_problems(path.read_text(), str(path.relative_to(REPO_ROOT)))
    ]
    assert not problems, "open with one short line, the detail after a blank line:\n" + "\n".join(problems)


def test_an_opening_over_two_lines_is_named_by_file_line_and_function():
    source = 'def f():\n    """Do one thing\n    and another.\n\n    Detail.\n    """\n'
    assert opening_problems(source, "m.py") == ["m.py:1:f: the opening runs over 2 lines"]


def test_a_long_opening_line_is_named_as_too_long():
    source = f'class C:\n    """{"x" * (LIMIT + 1)}"""\n'
    assert opening_problems(source, "m.py") == [f"m.py:1:C: the opening is {LIMIT + 1} characters, more than {LIMIT}"]


def test_a_module_docstring_is_checked_too():
    source = '"""A module\nwhose opening runs on."""\n'
    assert opening_problems(source, "m.py") == ["m.py:1:<module>: the opening runs over 2 lines"]


def test_a_short_opening_followed_by_detail_passes():
    source = (
        '"""A module."""\n\n\nasync def g():\n    """Return the thing.\n\n    The detail\n    runs on.\n    """\n'
        f'\n\ndef h():\n    """{"x" * LIMIT}"""\n'
    )
    assert opening_problems(source, "m.py") == []


def test_migrations_are_left_out_and_nothing_else():
    every = {path for root in CHECKED for path in (REPO_ROOT / root).rglob("*.py")}
    migrations = {path for path in every if "migrations" in path.relative_to(REPO_ROOT).parts}
    assert migrations, "no migrations found: the rule that leaves them out checks nothing"
    assert set(checked_files()) == every - migrations
