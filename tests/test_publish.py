"""The published pages (``docs/``, written by ``minillm publish``) match today's notebooks, show their
figures without a kernel, and fetch nothing from the network; and the command itself works, tested
on a two-cell notebook so that no chapter has to run here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from minillm.course import publish

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbconvert")

NOTEBOOKS = sorted(publish.NOTEBOOK_DIR.glob("*.ipynb"))
EXTERNAL = re.compile(r'<script[^>]+src=|<link[^>]+stylesheet|\bsrc="(?:https?:)?//', re.I)
PNG = 'src="data:image/png;base64,'


def test_every_chapter_has_a_current_page():
    """A notebook edited after its page was built (or a chapter with no page) fails here, in a second."""
    problems = publish.stale_pages(NOTEBOOKS, publish.DOCS_DIR)
    assert not problems, "the published pages in docs/ are out of date:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_published_page_is_self_contained_and_labelled(notebook: Path):
    page = publish.page_path(notebook, publish.DOCS_DIR)
    if not page.exists():
        pytest.skip(f"{page.name} is missing: test_every_chapter_has_a_current_page says so")
    text = page.read_text(encoding="utf-8")
    assert not EXTERNAL.findall(text), f"{page.name} loads something from elsewhere: {EXTERNAL.findall(text)[:3]}"
    assert publish.WIDGET_VIEW not in text, f"{page.name} holds a widget view that no page can render"
    meta = publish.page_meta(page)
    assert meta["mode"].startswith("small") and meta["machine"] and meta["built"]
    assert "MINILLM_SMALL=1" in text and meta["machine"] in text  # said on the page, not only in its head


TEXT_ONLY = ("00_welcome", "05b_paged_kernel")  # the welcome and the kernel puzzles print, they draw nothing


def test_published_pages_show_the_figures():
    """Every other chapter draws figures, most in widgets; its page carries them as embedded PNGs."""
    pages = [publish.page_path(n, publish.DOCS_DIR) for n in NOTEBOOKS if n.stem not in TEXT_ONLY]
    bare = [p.name for p in pages if p.exists() and PNG not in p.read_text(encoding="utf-8")]
    assert not bare, f"pages without a single figure: {bare}"


def fake_chapter(folder: Path) -> Path:
    """Two cells: a title, and a widget (controls over a figure, as every course widget is) plus the mode."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 1 · A fake chapter"),
        nbformat.v4.new_code_cell(
            "import os\n"
            "from matplotlib.figure import Figure\n"
            "from minillm.widgets.figure_view import FigureView\n"
            "fig = Figure(figsize=(2, 1))\n"
            "fig.subplots().plot([0, 1], [1, 0])\n"
            "view = FigureView(fig)\n"
            "view.refresh()\n"
            "print('MINILLM_SMALL is', os.environ['MINILLM_SMALL'])\n"
            "view"
        ),
    ]
    path = folder / "01_fake.ipynb"
    nbformat.write(nb, path)
    return path


def test_publish_writes_a_labelled_self_contained_page(tmp_path: Path):
    notebook = fake_chapter(tmp_path)
    out = tmp_path / "docs"
    page = publish.publish_one(notebook, out, machine="CPU: a test machine")
    publish.write_index(out)

    text = page.read_text(encoding="utf-8")
    assert "MINILLM_SMALL is 1" in text  # it ran, in small mode
    assert text.count(PNG) == 1  # the widget's still, embedded
    assert publish.WIDGET_VIEW not in text and not EXTERNAL.findall(text)
    body = text.partition("<main>")[2]
    assert body.index("small mode") < body.index("CPU: a test machine") < body.index("<h1")  # read first
    meta = publish.page_meta(page)
    assert meta["source-sha256"] == publish.source_sha256(notebook) and meta["title"] == "1 · A fake chapter"
    assert "](01_fake.html)" in (out / "index.md").read_text() and "](01_fake.ipynb)" in (out / "index.md").read_text()

    # The executed copy, which github.com renders: the banner first, the widget as its PNG only.
    executed = nbformat.read(publish.executed_path(notebook, out), as_version=4)
    assert "small mode" in executed.cells[0].source and executed.cells[0].cell_type == "markdown"
    bundles = [o.get("data", {}) for c in executed.cells for o in c.get("outputs", [])]
    assert any("image/png" in b for b in bundles) and not any(publish.WIDGET_VIEW in b for b in bundles)
    assert "widgets" not in executed.metadata
    assert publish.executed_meta(publish.executed_path(notebook, out))["source-sha256"] == meta["source-sha256"]

    assert publish.stale_pages([notebook], out) == []
    nb = nbformat.read(notebook, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("One more line."))
    nbformat.write(nb, notebook)
    assert publish.stale_pages([notebook], out) == [
        "01_fake.ipynb changed after 01_fake.html was built: run `minillm publish 01_fake`",
        "01_fake.ipynb changed after its executed copy was built: run `minillm publish 01_fake`",
    ]


def test_stale_pages_name_the_command(tmp_path: Path):
    notebook = fake_chapter(tmp_path)
    out = tmp_path / "docs"
    out.mkdir()
    (out / "99_gone.html").write_text("<html></html>")
    problems = publish.stale_pages([notebook], out)
    assert any("01_fake.ipynb has no page" in p and "`minillm publish 01_fake`" in p for p in problems)
    assert any("99_gone.html has no notebook" in p for p in problems)
    assert any("index.md does not link 01_fake.html" in p for p in problems)
    assert any("01_fake.ipynb has no executed copy in docs/" in p for p in problems)
    sha = publish.source_sha256(notebook)
    (out / "01_fake.html").write_text(f'<head><meta content="{sha[::-1]}" name="minillm-source-sha256"/></head>')
    assert any("changed after 01_fake.html was built" in p for p in publish.stale_pages([notebook], out))


def test_publish_refuses_edited_exercises(tmp_path: Path):
    """A page runs check() on exercises/: with a solved exercise it would show minillm's answers."""
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "ch01_naive.py").write_text("def greedy_decode_loop(): return 42\n")
    assert publish.edited_exercises(tmp_path) == ["ch01_naive.py"]


def executed_elsewhere(tmp_path: Path, **meta) -> Path:
    """A notebook as ``gpu_check --notebooks`` leaves it: outputs, and where and how it ran."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 3 · A chapter run elsewhere"), nbformat.v4.new_code_cell("1 + 1")]
    nb.cells[1].outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=1)]
    nb.metadata["minillm"] = {
        "source": "03_elsewhere.ipynb",
        "source-sha256": "ab" * 32,
        "built": "2026-12-04 11:58 UTC",
        "runtime-s": "89",
        "machine": "GPU: NVIDIA H200",
        "mode": "small mode (MINILLM_SMALL=1)",
        "versions": "Python 3.12.3, torch 2.11.0+cu130, CUDA 13.0",
        "status": "ok",
        **meta,
    }
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    path = runs / "03_elsewhere.ipynb"
    nbformat.write(nb, path)
    return path


def test_publish_from_labels_a_run_elsewhere_with_its_machine_and_versions(tmp_path: Path):
    executed_elsewhere(tmp_path)
    out = tmp_path / "docs" / "gpu"
    assert publish.main(["--from", str(tmp_path / "runs"), "--out", str(out)]) == 0
    text = (out / "03_elsewhere.html").read_text(encoding="utf-8")
    body = text.partition("<main>")[2]
    assert body.index("GPU: NVIDIA H200") < body.index("torch 2.11.0+cu130") < body.index("<h1")  # the label first
    assert "2026-12-04 11:58 UTC" in body and not EXTERNAL.findall(text)
    assert publish.page_meta(out / "03_elsewhere.html")["machine"] == "GPU: NVIDIA H200"
    index = (out / "index.md").read_text()
    assert "](03_elsewhere.html)" in index and "GPU: NVIDIA H200" in index and "CUDA 13.0" in index
    assert nbformat.read(out / "03_elsewhere.ipynb", as_version=4).cells[2].outputs[0]["data"]["text/plain"] == "2"


@pytest.mark.parametrize(
    "meta, message", [({"versions": None}, "lacks versions"), ({"status": "error"}, "status 'error'")]
)
def test_publish_from_refuses_a_run_it_cannot_label_or_that_failed(tmp_path: Path, meta, message):
    path = executed_elsewhere(tmp_path)
    nb = nbformat.read(path, as_version=4)
    for key, value in meta.items():
        if value is None:
            del nb.metadata["minillm"][key]
        else:
            nb.metadata["minillm"][key] = value
    nbformat.write(nb, path)
    with pytest.raises(ValueError, match=message):
        publish.publish_executed(path, tmp_path / "out")
    assert not (tmp_path / "out" / "03_elsewhere.html").exists()
