"""Opening the course on Colab: the first code cell of every chapter, and the README's links.

A Colab runtime starts with CUDA torch, ipywidgets and transformers installed, and without the course.
So every chapter notebook opens with the same cell (``setup_cell``): on Colab it clones the course,
installs it with pip (minillm asks only for ``torch>=2.4``, which Colab's own CUDA build meets, so pip
keeps it), makes the running kernel see it without a restart, moves into the clone's ``notebooks/``
(``check()`` grades ``../exercises``) and turns on the widget manager Colab needs for ipywidgets 8.
Anywhere else the cell does nothing. A Colab runtime forgets its files when it ends: setting
``MINILLM_COLAB_DIR`` to a folder on a mounted Google Drive keeps the learner's exercises.

The course's address is ``[project.urls] Repository`` in ``pyproject.toml``, the one place to change
it; then ``python -m minillm.course.colab`` rewrites every notebook's first cell and
``tests/test_colab.py`` checks that the notebooks and the README agree with it.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from minillm.course.paths import REPO_ROOT

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
MARKER = "# Colab: install the course into this runtime"  # how a notebook's setup cell is recognised
COLAB_URL = "https://colab.research.google.com/github/{owner_repo}/blob/main/notebooks/{name}"

SETUP_CELL = """# Colab: install the course into this runtime (a fresh runtime: about a minute). Elsewhere: nothing.
import os
import sys

if "google.colab" in sys.modules:
    import importlib.metadata
    import subprocess

    COURSE = os.environ.get("MINILLM_COLAB_DIR", "/content/minillm")  # a Drive folder keeps your exercises
    if not os.path.isdir(COURSE):
        subprocess.run(["git", "clone", "--depth", "1", "{repository}", COURSE], check=True)
    try:
        importlib.metadata.version("minillm")
    except importlib.metadata.PackageNotFoundError:  # Colab's CUDA torch meets torch>=2.4: pip keeps it
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", COURSE], check=True)
    sys.path.insert(0, COURSE)  # this kernel imports minillm without a restart
    os.chdir(os.path.join(COURSE, "notebooks"))  # check() grades ../exercises, your files
    from google.colab import output

    output.enable_custom_widget_manager()  # Colab shows ipywidgets 8 through it
    import torch

    print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else
          "none (Runtime > Change runtime type > a GPU, then run this cell again)")"""


def repository(pyproject: Path = REPO_ROOT / "pyproject.toml") -> str:
    """The course's public address, from ``[project.urls] Repository``."""
    urls = tomllib.loads(Path(pyproject).read_text()).get("project", {}).get("urls", {})
    if "Repository" not in urls:
        raise ValueError(f"{pyproject}: [project.urls] has no Repository (the address Colab clones)")
    return urls["Repository"]


def owner_repo(url: str) -> str:
    """``"owner/name"`` of a GitHub address."""
    match = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?/?", url)
    if match is None:
        raise ValueError(f"Repository must be https://github.com/<owner>/<name> for Colab to open it, got {url!r}")
    return match.group(1)


def setup_cell(url: str | None = None) -> str:
    """The first code cell of every chapter notebook."""
    return SETUP_CELL.replace("{repository}", url or repository())


def colab_link(notebook: str, url: str | None = None) -> str:
    """The address that opens ``notebook`` (a file name under ``notebooks/``) on Colab."""
    return COLAB_URL.format(owner_repo=owner_repo(url or repository()), name=notebook)


def write_setup_cells(url: str | None = None, notebook_dir: Path = NOTEBOOK_DIR) -> list[Path]:
    """Put the setup cell first among the code cells of every notebook (replacing an older one);
    returns the notebooks it changed. Only that cell's source is touched."""
    import nbformat

    source = setup_cell(url)
    changed = []
    for path in sorted(Path(notebook_dir).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        first = nb.cells[code[0]] if code else None
        if first is not None and first.source.startswith(MARKER):
            if first.source == source:
                continue
            first.source = source
        else:
            cell = nbformat.v4.new_code_cell(source)
            cell.id = "colab-setup"
            nb.cells.insert(code[0] if code else len(nb.cells), cell)
        nbformat.write(nb, path)
        changed.append(path)
    return changed


def main() -> int:
    """Rewrite every notebook's setup cell for the address in pyproject.toml."""
    changed = write_setup_cells()
    for path in changed:
        print(f"updated {path.relative_to(REPO_ROOT)}")
    print(f"{len(changed)} notebook(s) changed; the course's address: {repository()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
