"""Colab: every chapter's first code cell installs the course on Colab and does nothing elsewhere.

No Colab runtime is reachable here, so the cell runs in this process with Colab faked: a
``google.colab`` module whose widget-manager switch records the call, and ``subprocess.run``
replaced by a recorder (``git clone`` creates the folder it would). What cannot run here: the real
clone and pip install on Colab, Colab's widget manager drawing ipywidgets 8, a T4 GPU.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement

from minillm.course import colab

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def first_code_cell(path: Path) -> str:
    return next(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_opens_with_the_setup_cell(path: Path):
    assert first_code_cell(path) == colab.setup_cell(), (
        f"{path.name}: the first code cell is not the Colab setup cell for {colab.repository()}; "
        "run `python -m minillm.course.colab`"
    )


def test_readme_opens_every_chapter_on_colab():
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in NOTEBOOKS if colab.colab_link(p.name) not in readme]
    assert not missing, f"README.md has no 'Open in Colab' link for {missing} (colab.colab_link)"


def test_a_missing_address_is_named(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "minillm"\n')
    with pytest.raises(ValueError, match=r"\[project.urls\] has no Repository"):
        colab.repository(pyproject)


def test_the_address_must_be_a_github_repository():
    assert colab.owner_repo("https://github.com/someone/minillm.git") == "someone/minillm"
    with pytest.raises(ValueError, match="Repository must be https://github.com/<owner>/<name>"):
        colab.owner_repo("https://gitlab.com/someone/minillm")


def test_installing_keeps_colabs_torch():
    """pip keeps an installed torch that meets every requirement on it: minillm's only one is a
    lower bound, which Colab's CUDA builds (local version labels included) meet."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_reqs = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "torch"]
    assert [str(r.specifier) for r in torch_reqs] == [">=2.4"]
    for colab_torch in ("2.4.1+cu121", "2.6.0+cu124", "2.9.0+cu126"):
        assert torch_reqs[0].specifier.contains(colab_torch)


class FakeColab:
    """``google.colab`` as the cell uses it, and a ``subprocess.run`` that records its commands."""

    def __init__(self):
        self.commands: list[list[str]] = []
        self.widget_manager_enabled = 0

    def modules(self) -> dict:
        google = types.ModuleType("google")
        package = types.ModuleType("google.colab")
        output = types.ModuleType("google.colab.output")
        output.enable_custom_widget_manager = self.enable
        package.output = output
        google.colab = package
        return {"google": google, "google.colab": package, "google.colab.output": output}

    def enable(self):
        self.widget_manager_enabled += 1

    def run(self, command, check=False, **kwargs):
        self.commands.append(list(command))
        if command[:2] == ["git", "clone"]:
            (Path(command[-1]) / "notebooks").mkdir(parents=True)
        return subprocess.CompletedProcess(command, 0)


def run_cell(monkeypatch, fake: FakeColab | None, installed: bool) -> str:
    """Execute the setup cell as a fresh kernel would; what it printed."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the cell prepends the clone
    monkeypatch.setattr(subprocess, "run", fake.run if fake else _no_command)
    if fake:
        for name, module in fake.modules().items():
            monkeypatch.setitem(sys.modules, name, module)
    if not installed:

        def version(name):
            if name == "minillm":
                raise importlib.metadata.PackageNotFoundError(name)
            return "0"

        monkeypatch.setattr(importlib.metadata, "version", version)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(colab.setup_cell(), "setup cell", "exec"), {})
    return printed.getvalue()


def _no_command(command, **kwargs):
    raise AssertionError(f"outside Colab the setup cell ran {command}")


def test_outside_colab_the_cell_does_nothing(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    assert run_cell(monkeypatch, None, installed=False) == ""
    assert Path.cwd() == tmp_path and sys.path == before


def test_on_a_fresh_colab_runtime_the_cell_clones_installs_and_enables_widgets(monkeypatch, tmp_path):
    course = tmp_path / "minillm"
    monkeypatch.setenv("MINILLM_COLAB_DIR", str(course))
    monkeypatch.chdir(tmp_path)
    fake = FakeColab()
    printed = run_cell(monkeypatch, fake, installed=False)
    assert fake.commands == [
        ["git", "clone", "--depth", "1", colab.repository(), str(course)],
        [sys.executable, "-m", "pip", "install", "-q", "-e", str(course)],  # no torch named: Colab's stays
    ]
    assert sys.path[0] == str(course), "the running kernel must import the clone without a restart"
    assert Path.cwd() == course / "notebooks", "check() grades ../exercises: the kernel must work in notebooks/"
    assert fake.widget_manager_enabled == 1
    assert printed.startswith("GPU: ")


def test_run_again_the_cell_neither_clones_nor_installs(monkeypatch, tmp_path):
    """A second run (or a new runtime with the clone kept on Drive and the package installed)."""
    course = tmp_path / "minillm"
    (course / "notebooks").mkdir(parents=True)
    monkeypatch.setenv("MINILLM_COLAB_DIR", str(course))
    monkeypatch.chdir(tmp_path)
    fake = FakeColab()
    run_cell(monkeypatch, fake, installed=True)
    assert fake.commands == []
    assert Path.cwd() == course / "notebooks" and fake.widget_manager_enabled == 1


def test_write_setup_cells_puts_the_cell_first_once(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A chapter"), nbformat.v4.new_code_cell("SMALL = 1")]
    path = tmp_path / "01_x.ipynb"
    nbformat.write(nb, path)
    assert colab.write_setup_cells("https://github.com/a/b", tmp_path) == [path]
    cells = nbformat.read(path, as_version=4).cells
    assert [c.cell_type for c in cells] == ["markdown", "code", "code"]
    assert cells[1].source == colab.setup_cell("https://github.com/a/b") and cells[2].source == "SMALL = 1"
    assert colab.write_setup_cells("https://github.com/a/b", tmp_path) == []  # already current
    colab.write_setup_cells("https://github.com/c/d", tmp_path)  # a new address replaces the cell
    cells = nbformat.read(path, as_version=4).cells
    assert len(cells) == 3 and "https://github.com/c/d" in cells[1].source
