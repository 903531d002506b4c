"""``minillm publish``: every chapter run once, in small mode, and saved under ``docs/`` twice: as an
executed notebook (``docs/NN.ipynb``, which github.com renders with its figures) and as a
self-contained HTML page (for GitHub Pages or a download), so a reader sees every figure without
running anything.

The notebooks themselves stay committed without outputs: a learner's numbers are their own. The
pages are copies, labelled at the top with how and where they ran. Each page records the sha256 of
the notebook it came from, so a fast test can tell that a notebook changed after its page was built
(``stale_pages``, checked by ``tests/test_publish.py``).

A widget shows as its PNG still (``minillm.widgets.figure_view.StaticFallback`` puts one in every
display bundle): the live widget needs a kernel, the picture does not.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import platform
import re
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from minillm.course.exercises import PATTERN, is_untouched
from minillm.course.paths import REPO_ROOT

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
DOCS_DIR = REPO_ROOT / "docs"
COMMAND = "minillm publish"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
CELL_TIMEOUT_S = 600  # one cell; small mode takes seconds, a slow machine gets room

# nbconvert's JupyterLab page without what it would fetch from the network (require.js, MathJax,
# Mermaid, the widget manager) and without its 240 KB stylesheet: a few lines of CSS do for reading.
# The meta tags record where the page came from; ``stale_pages`` and ``write_index`` read them back.
TEMPLATE = """{%- extends 'index.html.j2' -%}
{% block html_head_js %}{% endblock %}
{% block jupyter_widgets %}{% endblock %}
{% block html_head_js_mathjax %}{% endblock %}
{% block html_head_js_mermaidjs %}{% endblock %}
{% block notebook_css %}<style>{{ resources.page_css }}</style>{% endblock %}
{% block extra_css %}{% for name, value in resources.page_meta.items() %}
<meta name="minillm-{{ name }}" content="{{ value | escape_html_keep_quotes }}">{% endfor %}
{% endblock %}
"""

CSS = """
:root { --jp-mirror-editor-keyword-color: #008000; --jp-mirror-editor-number-color: #080;
  --jp-mirror-editor-operator-color: #a2f; --jp-mirror-editor-comment-color: #408080;
  --jp-mirror-editor-string-color: #ba2121; --jp-mirror-editor-punctuation-color: #05a;
  --jp-mirror-editor-error-color: #f00; --jp-mirror-editor-def-color: #00f; }
body { font-family: system-ui, sans-serif; line-height: 1.5; max-width: 980px; margin: 2em auto; padding: 0 1em; }
.jp-InputPrompt, .jp-OutputPrompt { display: none; }
.jp-CodeCell .jp-InputArea { background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 4px; margin: 1em 0 0.3em; }
pre { margin: 0; padding: 0.5em 0.8em; overflow-x: auto; font-size: 13px; }
.jp-OutputArea-output pre { background: none; }
.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"] pre { background: #fff5f5; }
img { max-width: 100%; height: auto; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 14px; }
th, td { border: 1px solid #d0d7de; padding: 2px 8px; }
blockquote { border-left: 4px solid #d0d7de; margin: 0; padding: 0 1em; color: #444; }
.jp-RenderedMarkdown blockquote:first-child { background: #fff8c5; border-color: #d4a72c; }
"""


def source_sha256(notebook: Path) -> str:
    return hashlib.sha256(Path(notebook).read_bytes()).hexdigest()


def page_path(notebook: Path, out_dir: Path) -> Path:
    return Path(out_dir) / f"{Path(notebook).stem}.html"


def executed_path(notebook: Path, out_dir: Path) -> Path:
    return Path(out_dir) / f"{Path(notebook).stem}.ipynb"


def chapter_title(nb) -> str:
    """The first heading of the notebook: the chapter's name, for the page title and the index."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return "untitled"


def machine_label() -> str:
    """Where the figures were measured: the GPU if torch sees one, else the CPU and its cores."""
    import torch

    if torch.cuda.is_available():
        return f"GPU: {torch.cuda.get_device_name(0)}"
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), flags=re.M)
        model = found.group(1).strip() if found else model
    return f"CPU: {model}, {os.cpu_count()} cores, {platform.system()}"


def kernel_env(ipython_dir: Path, small: bool = True) -> dict[str, str]:
    """Small mode (or, with ``small=False``, full mode: the learner's default), offline, with check()
    grading the exercises as shipped: as the notebook test runs."""
    env = dict(os.environ)
    for name in ("MINILLM_MODEL", "MINILLM_IMPL", "MINILLM_SMALL"):
        env.pop(name, None)
    if small:
        env["MINILLM_SMALL"] = "1"
    env.update(
        MPLBACKEND="module://matplotlib_inline.backend_inline",
        HF_HUB_OFFLINE="1",
        PYDEVD_DISABLE_FILE_VALIDATION="1",
        IPYTHONDIR=str(ipython_dir),  # no user profile or startup files
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p),
    )
    return env


def execute(nb, cwd: Path, timeout: float = CELL_TIMEOUT_S, small: bool = True, started=None) -> None:
    """Run ``nb`` in place, in a kernel on this very interpreter (so it sees this minillm), in small
    mode unless ``small`` is False. ``started(km)``, when given, receives the kernel's manager before
    the first cell runs (a caller with a deadline can shut the kernel down)."""
    import nbclient
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp, "kernels", "python3")
        spec.mkdir(parents=True)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
        specs = KernelSpecManager(kernel_dirs=[str(spec.parent)])
        km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=specs)  # async: a dead kernel is noticed
        client = nbclient.NotebookClient(nb, km=km, timeout=timeout, allow_errors=False, store_widget_state=False)
        if started is not None:
            started(km)
        client.execute(env=kernel_env(Path(tmp, "ipython"), small), cwd=str(cwd))


def for_static_page(nb):
    """Drop what only a live kernel can show: a widget's view (its PNG still stays in the same
    bundle and is shown instead) and the widget state. A widget with no still says so."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if data.pop(WIDGET_VIEW, None) is not None and "image/png" not in data:
                data["text/plain"] = "(an interactive widget: open the notebook in Jupyter to use it)"
    return nb


def banner(notebook: Path, meta: dict[str, str]):
    """The label at the top of every page: small mode, the machine, the date."""
    import nbformat

    text = (
        f"> **A published copy of `notebooks/{notebook.name}`, run once by `{COMMAND}` in small mode "
        f"(`MINILLM_SMALL=1`: the built-in tiny model and short workloads, the mode of the automated notebook "
        f"test) on {meta['built']}, in {meta['runtime-s']} s, on {meta['machine']}.** Times and figures measured "
        "here are that machine's; figures from the simulator are simulated (for example the H200 profile), not "
        "measured on a GPU. The exercises ran as shipped, not yet implemented, so their checks show ✗ and "
        "no answer is shown. Open the notebook in Jupyter to run it on your machine, in full mode."
    )
    return nbformat.v4.new_markdown_cell(text)


def render_html(nb, meta: dict[str, str]) -> str:
    """A self-contained page: images embedded as data URIs, no script or stylesheet fetched."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        extra_loaders=[DictLoader({"minillm_page.html.j2": TEMPLATE})],
        template_file="minillm_page.html.j2",
        embed_images=True,
        exclude_anchor_links=True,  # headings keep their ids; the ¶ marks need the lab stylesheet to hide
    )
    nb.metadata["title"] = meta["title"]
    body, _ = exporter.from_notebook_node(nb, resources={"page_css": CSS, "page_meta": meta})
    return body


def publish_one(notebook: Path, out_dir: Path, machine: str) -> Path:
    """Run one notebook in small mode and write its page; return the page's path."""
    import nbformat

    notebook = Path(notebook)
    sha = source_sha256(notebook)
    nb = nbformat.read(notebook, as_version=4)
    start = time.perf_counter()
    execute(nb, cwd=notebook.parent)
    meta = {
        "source": notebook.name,
        "source-sha256": sha,
        "title": chapter_title(nb),
        "built": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "runtime-s": f"{time.perf_counter() - start:.0f}",
        "machine": machine,
        "mode": "small (MINILLM_SMALL=1)",
    }
    nb.cells.insert(0, banner(notebook, meta))
    nb = for_static_page(nb)
    page = page_path(notebook, out_dir)
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(render_html(nb, meta), encoding="utf-8")
    nb.metadata["minillm"] = meta
    nbformat.write(nb, executed_path(notebook, out_dir))
    return page


def versions_label() -> str:
    """The versions a run's figures depend on, for its label."""
    import torch

    parts = [f"Python {platform.python_version()}", f"torch {torch.__version__}"]
    if torch.version.cuda:
        parts.append(f"CUDA {torch.version.cuda}")
    try:
        import transformers

        parts.append(f"transformers {transformers.__version__}")
    except ImportError:
        pass
    return ", ".join(parts)


FROM_FIELDS = ("source", "source-sha256", "built", "runtime-s", "machine", "mode", "versions")


def from_banner(meta: dict[str, str]):
    """The label of a page made from a run elsewhere (``--from``): where, when, in what, and that it
    is a record of that run, not of the notebook as it is now."""
    import nbformat

    text = (
        f"> **A record of `notebooks/{meta['source']}` as it ran on {meta['machine']} on {meta['built']}, in "
        f"{meta['runtime-s']} s, in {meta['mode']}, with {meta['versions']}.** Its times and figures are that "
        "machine's. The page is that run's output, not rebuilt from the notebook as it is now, whose text may "
        f"have changed since (the run's notebook had sha256 `{meta['source-sha256'][:12]}`). The exercises ran "
        "as shipped, not yet implemented, so their checks show ✗."
    )
    return nbformat.v4.new_markdown_cell(text)


def publish_executed(executed: Path, out_dir: Path) -> Path:
    """A page, and a copy, of a notebook executed elsewhere (``gpu_check --notebooks``); return the page."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    meta = {k: str(v) for k, v in nb.metadata.get("minillm", {}).items()}
    missing = [k for k in FROM_FIELDS if k not in meta]
    if missing:
        raise ValueError(f"{executed}: metadata.minillm lacks {', '.join(missing)}: not a run that can be published")
    if meta.get("status", "ok") != "ok":
        raise ValueError(f"{executed}: the run ended with status {meta['status']!r}, not 'ok'")
    meta["title"] = chapter_title(nb)
    nb.cells.insert(0, from_banner(meta))
    nb = for_static_page(nb)
    out_dir.mkdir(parents=True, exist_ok=True)
    page = page_path(executed, out_dir)
    page.write_text(render_html(nb, meta), encoding="utf-8")
    nbformat.write(nb, executed_path(executed, out_dir))
    return page


def write_from_index(out_dir: Path) -> Path:
    """``index.md`` of the pages made with ``--from``: one line per page, from what each records."""
    rows = [
        f"| [{m.get('source')}]({p.name}) · [notebook]({p.stem}.ipynb) | {m.get('title', '')} | {m.get('machine')} | "
        f"{m.get('built')} | {m.get('versions')} | {m.get('runtime-s')} s |"
        for p in sorted(Path(out_dir).glob("*.html"))
        for m in [page_meta(p)]
    ]
    text = "\n".join(
        [
            "# minillm, chapters as they ran elsewhere",
            "",
            "Each page is one chapter notebook as it ran on the machine named, in small mode (the tiny model),",
            f"saved with its outputs and published here with `{COMMAND} --from DIR`. A record of that run: the",
            "notebooks may have changed since. The chapters as published from a CPU run are one folder up.",
            "",
            "| page | chapter | machine | run | versions | run time |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    index = Path(out_dir) / "index.md"
    index.write_text(text, encoding="utf-8")
    return index


def page_meta(page: Path) -> dict[str, str]:
    """The ``minillm-*`` meta tags a page was written with (in its head; attributes in any order)."""
    head = Path(page).read_text(encoding="utf-8").partition("</head>")[0]
    tags = re.findall(r'<meta\b(?=[^>]*\bname="minillm-([\w-]+)")(?=[^>]*\bcontent="([^"]*)")', head)
    return {name: html.unescape(value) for name, value in tags}


def executed_meta(executed: Path) -> dict[str, str]:
    """What an executed copy was written with (its notebook metadata, ``minillm``)."""
    return json.loads(Path(executed).read_text(encoding="utf-8")).get("metadata", {}).get("minillm", {})


def write_index(out_dir: Path) -> Path:
    """``docs/index.md``: one line per page, from what each page records."""
    rows = []
    for page in sorted(Path(out_dir).glob("*.html")):
        meta = page_meta(page)
        rows.append(
            f"| [{meta.get('source', page.stem)}]({page.name}) · [notebook]({page.stem}.ipynb) | "
            f"{meta.get('title', '')} | {meta.get('built', '?')} | {meta.get('runtime-s', '?')} s |"
        )
    machines = sorted({page_meta(p).get("machine", "?") for p in Path(out_dir).glob("*.html")})
    text = "\n".join(
        [
            "# minillm, the chapters as published pages",
            "",
            "Each chapter notebook, run once and saved with its outputs, so every figure shows without a",
            "kernel: as an HTML page (for GitHub Pages or a download) and as an executed notebook (github.com",
            "shows it with its figures). Run in small mode (`MINILLM_SMALL=1`: the tiny model and short workloads) on",
            f"{'; '.join(machines)}.",
            "",
            "Measured figures are that machine's; the simulator's figures are simulated (the H200 profile",
            "among them), not measured on a GPU. The notebooks in `notebooks/` are the course itself: run",
            "them for your own numbers.",
            "",
            f"Rebuild with `{COMMAND}` (every chapter, a few minutes) or `{COMMAND} 07` (the chapters named);",
            "`tests/test_publish.py` fails when a notebook changed after its page was built.",
            "",
            "| page | chapter | built | small-mode run |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )
    index = Path(out_dir) / "index.md"
    index.write_text(text, encoding="utf-8")
    return index


def stale_pages(notebooks: list[Path], out_dir: Path) -> list[str]:
    """Why ``out_dir`` does not match ``notebooks``, one line per page; empty when it does."""
    problems = []
    for notebook in notebooks:
        page = page_path(notebook, out_dir)
        rebuild = f"run `{COMMAND} {notebook.stem}`"
        if not page.exists():
            problems.append(f"{notebook.name} has no page {page.name}: {rebuild}")
        elif page_meta(page).get("source-sha256") != source_sha256(notebook):
            problems.append(f"{notebook.name} changed after {page.name} was built: {rebuild}")
        executed = executed_path(notebook, out_dir)
        if not executed.exists():
            problems.append(f"{notebook.name} has no executed copy in {Path(out_dir).name}/: {rebuild}")
        elif executed_meta(executed).get("source-sha256") != source_sha256(notebook):
            problems.append(f"{notebook.name} changed after its executed copy was built: {rebuild}")
    known = {page_path(n, out_dir).name for n in notebooks}
    known |= {executed_path(n, out_dir).name for n in notebooks}
    problems += [
        f"{p.name} has no notebook: delete it and run `{COMMAND}`"
        for p in sorted([*Path(out_dir).glob("*.html"), *Path(out_dir).glob("*.ipynb")])
        if p.name not in known
    ]
    index = Path(out_dir) / "index.md"
    listed = index.read_text(encoding="utf-8") if index.exists() else ""
    problems += [
        f"index.md does not link {name}: run `{COMMAND}`" for name in sorted(known) if f"]({name})" not in listed
    ]
    return problems


def edited_exercises(root: Path = REPO_ROOT) -> list[str]:
    """Exercise files that are not the shipped stubs: a page would show their checks passing and
    minillm's answers."""
    return [p.name for p in sorted((root / "exercises").glob(PATTERN)) if not is_untouched(p.read_text())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Run chapter notebooks in small mode (MINILLM_SMALL=1) and save each as a self-contained "
        "HTML page with its figures, labelled with the machine and date, under docs/, with docs/index.md.",
    )
    parser.add_argument(
        "chapters", nargs="*", help="notebook names or prefixes, e.g. 07 or 05b_paged_kernel (default: every chapter)"
    )
    parser.add_argument("--out", type=Path, help="where the pages go (default: docs/, with --from docs/gpu/)")
    parser.add_argument(
        "--from",
        dest="from_dir",
        type=Path,
        help="publish the notebooks executed elsewhere into DIR (gpu_check --notebooks) instead of running any",
    )
    args = parser.parse_args(argv)
    if args.from_dir:
        return publish_from(args.from_dir, args.out or DOCS_DIR / "gpu")
    args.out = args.out or DOCS_DIR

    notebooks = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    if args.chapters:
        chosen = [n for n in notebooks if any(n.stem.startswith(c.removesuffix(".ipynb")) for c in args.chapters)]
        if not chosen:
            raise ValueError(f"no notebook matches {args.chapters} (in {NOTEBOOK_DIR})")
        notebooks = chosen
    edited = edited_exercises()
    if edited:
        raise ValueError(
            f"exercises/ holds edits ({', '.join(edited)}): the pages would show answers; publish "
            "from a checkout whose exercises are the shipped stubs"
        )
    machine = machine_label()
    failed = []
    for notebook in notebooks:
        start = time.perf_counter()
        try:
            page = publish_one(notebook, args.out, machine)
        except Exception as err:  # one chapter that fails leaves its old page and the others go on
            failed.append(notebook.name)
            print(f"  FAILED  {notebook.name}: {type(err).__name__}: {str(err)[-500:]}", file=sys.stderr)
            continue
        size = page.stat().st_size / 1e6
        print(f"  wrote   {page} ({size:.1f} MB, {time.perf_counter() - start:.0f} s)", flush=True)
    print(f"  wrote   {write_index(args.out)}")
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def publish_from(from_dir: Path, out_dir: Path) -> int:
    """``--from``: a page for every executed notebook in ``from_dir``, then the index."""
    executed = sorted(Path(from_dir).glob("*.ipynb"))
    if not executed:
        raise ValueError(f"--from {from_dir}: no executed notebooks (*.ipynb) there")
    for notebook in executed:
        print(f"  wrote   {publish_executed(notebook, out_dir)}", flush=True)
    print(f"  wrote   {write_from_index(out_dir)}")
    return 0
