"""The README's command that starts the course opens JupyterLab at the course's folder, so a
chapter's link to its exercise file (``../exercises/chNN_*.py``) opens that file in Lab's editor.

Started from a notebook's path alone, Jupyter Server serves the notebook's folder (``notebooks/``),
and every such link answers 404 in the browser although the file exists on disk. Here the README's
own ``jupyter lab`` line runs (with a loopback port and a token added), the server is asked for an
exercise file (what a chapter's link asks for in the browser), and Chromium follows chapter 1's link
into Lab's editor. It runs in the notebooks' xdist group: one server start, kept out of the way of the
timed tests beside them."""

from __future__ import annotations

import json
import shlex
import urllib.request

import pytest

from tests.jupyterlab import ROOT, launch_chromium, require_browser, start_jupyterlab
from tests.test_project import readme_block


def readme_lab_args() -> list[str]:
    """The arguments of the README's ``jupyter lab`` line (after ``jupyter lab``)."""
    (line,) = [x for x in readme_block("Install and start the course").splitlines() if x.startswith("jupyter lab")]
    return shlex.split(line)[2:]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The README's command, run in a folder laid out like the course (each top-level entry linked to
    the repository's), so that the kernel's pid files land there and not in the checkout."""
    tmp_path = tmp_path_factory.mktemp("readme_lab")
    course = tmp_path / "course"
    course.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".venv"):
            (course / entry.name).symlink_to(entry)
    server = start_jupyterlab(tmp_path, course, {"MINILLM_SMALL": "1"}, lab_args=readme_lab_args())
    yield server
    server.stop()


pytestmark = pytest.mark.xdist_group("notebooks")


def test_the_readme_command_serves_the_course_folder(lab):
    url = f"{lab.url}api/contents/exercises/ch05_paged.py?content=0&token={lab.token}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert json.load(answer)["type"] == "file"
    url = f"{lab.url}api/contents/notebooks/00_welcome.ipynb?content=0&token={lab.token}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert json.load(answer)["type"] == "notebook"  # the file the command opens, under the same root


@pytest.mark.slow
def test_a_chapters_link_opens_its_exercise_in_labs_editor(lab, request):
    require_browser()
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page = launch_chromium(request).new_page()
    try:
        page.goto(f"{lab.url}lab/tree/notebooks/01_naive_loop.ipynb?token={lab.token}", timeout=60_000)
        page.locator(".jp-RenderedMarkdown a[href*='/exercises/ch01_naive.py']").first.click(timeout=60_000)
        first_line = (ROOT / "exercises" / "ch01_naive.py").read_text().splitlines()[0]
        # the editor appears first and fills when the file's contents arrive: wait for the text itself
        editor = page.locator(".jp-FileEditor .cm-content", has_text=first_line[:60]).first
        try:
            editor.wait_for(timeout=30_000)
        except PlaywrightTimeout:
            pytest.fail("the exercise file did not open in Lab's editor within 30 s")
    finally:
        page.close()
        lab.shutdown_kernels()
