"""The project's plumbing: one source of dependencies, and CI running exactly the README's commands."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def readme_block(title: str) -> str:
    """The fenced shell block that follows the README line containing ``title``."""
    text = (ROOT / "README.md").read_text()
    m = re.search(re.escape(title) + r".*?```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert m, f"README has no shell block after {title!r}"
    return m.group(1).strip()


def test_environment_yml_installs_the_project_from_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = env["dependencies"]
    pip_parts = [d["pip"] for d in deps if isinstance(d, dict) and "pip" in d]
    assert pip_parts == [["-e .[dev]"]], "environment.yml's pip part must install the project and nothing else"
    conda_names = {re.split(r"[=<> ]", d)[0] for d in deps if isinstance(d, str)}
    assert conda_names == {"python", "pip"}, "every other dependency belongs in pyproject.toml"
    python = next(d for d in deps if isinstance(d, str) and d.startswith("python"))
    minimum = pyproject["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, python.split("=")[1].split("."))) >= tuple(map(int, minimum.split(".")))
    assert "dev" in pyproject["project"]["optional-dependencies"]


def test_ci_runs_the_readme_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    install = readme_block("Install and start the course")
    for line in install.splitlines():
        if line.startswith("pip"):
            assert line in ci, f"CI does not install as the README says: {line}"
    test_cmd = readme_block("Run the tests")
    assert ci.rstrip().splitlines()[-1] == test_cmd


def test_pyproject_lists_the_course_dependencies():
    deps = " ".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    for name in ("torch", "transformers", "matplotlib", "ipywidgets", "jupyterlab"):
        assert name in deps
