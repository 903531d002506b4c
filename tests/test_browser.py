"""The one end-to-end browser test: a learner's JupyterLab, a real Chromium, a real widget.

Everything else about the widgets is tested as state (``test_widgets.py``). This test checks what
only a browser can: that JupyterLab renders ``slots_timeline`` from a live kernel (play button,
slider, figure, step text), and that moving the slider with the keyboard and pressing play change
the step text and put exactly that step's picture in the page (the PNG bytes the image shows are
compared with the ones the kernel draws for each step).

The test starts JupyterLab on 127.0.0.1 (a free port, a token, a temporary root directory holding a
notebook it writes, temporary Jupyter config / data / runtime directories, and a kernel that runs
this interpreter), drives Debian's Chromium with Playwright, and stops both at the end, passed or
failed. It needs ``apt-get install chromium`` and ``pip install playwright`` (in the ``dev``
extra); never ``playwright install``. Without them it skips, except under ``CI=true``, where it
fails. A screenshot of the final page is kept in the test's tmp directory (printed with ``-s``).

    python -m pytest tests/test_browser.py -s
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Debian's package (Ubuntu's puts it elsewhere on PATH); Playwright's own browser downloads are not used.
CHROMIUM = "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else shutil.which("chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
KERNEL_NAME = "minillm-browser-test"
SERVER_START_S = 60  # JupyterLab's start on a busy 2-core machine
RENDER_S = 60  # kernel start, torch import, the run and the widget's first render
UPDATE_S = 15  # one redraw after a slider move

NOTEBOOK_CELLS = [
    ("markdown", "# Browser test\nA real continuous-batching run of the tiny model, shown as a slots timeline."),
    (
        "code",
        "import os\nfrom pathlib import Path\n\n"
        "Path('kernel.pid').write_text(str(os.getpid()))  # lets the test stop this kernel if the server cannot\n"
        "from minillm import LLM, workloads\nfrom minillm.widgets import slots_timeline",
    ),
    (
        "code",
        "w = workloads.two_slot_example()\n"
        "llm = LLM('tiny', engine='continuous', max_num_seqs=2)\n"
        "outputs = llm.generate(w.prompts, w.sampling_params, w.arrival_times)\n"
        "timeline = slots_timeline(llm.trace, outputs)\n"
        "timeline.play.interval = 300\n"
        "timeline",
    ),
    (
        "code",
        "# What the page should show: the PNG of every step, drawn by a second, undisplayed timeline.\n"
        "import hashlib, json\n\n"
        "reference = slots_timeline(llm.trace, outputs)\n"
        "pictures = []\n"
        "for step in range(reference.slider.max + 1):\n"
        "    reference.slider.value = step\n"
        "    pictures.append(hashlib.sha256(reference.image.value).hexdigest())\n"
        "print('PNG_SHA256', json.dumps(pictures))",
    ),
]


# --- what the test needs ----------------------------------------------------------------------


@pytest.fixture
def needs_browser():
    """Playwright's Python package and Debian's Chromium, or a skip (a failure under CI=true).
    Checked before any server or browser starts."""
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the Python package playwright (pip install -e '.[dev]')")
    if CHROMIUM is None:
        missing.append(
            "Chromium: /usr/bin/chromium or chromium on PATH (as root: apt-get update && apt-get install -y chromium)"
        )
    if missing:
        message = "the browser test needs " + " and ".join(missing) + "; never run `playwright install`"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message)


def _write_notebook(path: Path) -> None:
    cells = []
    for i, (kind, source) in enumerate(NOTEBOOK_CELLS):
        cell = {"cell_type": kind, "id": f"cell-{i}", "metadata": {}, "source": source}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        cells.append(cell)
    path.write_text(
        json.dumps(
            {
                "cells": cells,
                "metadata": {
                    "kernelspec": {
                        "name": KERNEL_NAME,
                        "display_name": "Python 3 (browser test)",
                        "language": "python",
                    },
                    "language_info": {"name": "python"},
                },
                "nbformat": 4,
                "nbformat_minor": 5,
            },
            indent=1,
        )
    )


def _jupyter_dirs(tmp: Path) -> dict[str, str]:
    """Config, data and runtime directories of our own: the user's settings, workspaces, kernels
    and running servers are neither read nor touched."""
    dirs = {name: tmp / name for name in ("config", "data", "runtime", "ipython", "root")}
    for d in dirs.values():
        d.mkdir()
    spec = dirs["data"] / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (browser test)",
                "language": "python",
            }
        )
    )
    # No news or update checks: nothing may reach for the network, and no toast covers the page.
    settings = dirs["config"] / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    return {k: str(v) for k, v in dirs.items()}


# --- fixtures: a server and a browser that stop even when the test fails ----------------------


class Server:
    def __init__(self, url: str, token: str, root: Path, proc: subprocess.Popen, log: Path):
        self.url, self.token, self.root, self.proc, self.log = url, token, root, proc, log

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _stop(proc: subprocess.Popen, url: str | None, token: str, root: Path, runtime: str) -> None:
    """Ask the server to shut down (it stops its kernels), then end its process group, then any
    kernel that is still alive."""
    if proc.poll() is None and url:
        try:
            request = urllib.request.Request(
                f"{url}api/shutdown", method="POST", headers={"Authorization": f"token {token}"}
            )
            urllib.request.urlopen(request, timeout=5).close()
            proc.wait(timeout=10)
        except Exception:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:  # the kernel runs in a session of its own, so the group kill above does not reach it
        pid = int((root / "kernel.pid").read_text())
        # Only our kernel: its connection file lies in our runtime directory (never a reused pid).
        if runtime.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


@pytest.fixture
def jupyter_server(tmp_path: Path, request):
    dirs = _jupyter_dirs(tmp_path)
    root = Path(dirs["root"])
    _write_notebook(root / "timeline.ipynb")
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update(
        JUPYTER_CONFIG_DIR=dirs["config"],
        JUPYTER_DATA_DIR=dirs["data"],
        JUPYTER_RUNTIME_DIR=dirs["runtime"],
        IPYTHONDIR=dirs["ipython"],
        MINILLM_SMALL="1",
        HF_HUB_OFFLINE="1",
        MPLBACKEND="Agg",
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
        OMP_WAIT_POLICY="PASSIVE",
        PYDEVD_DISABLE_FILE_VALIDATION="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    env.pop("MINILLM_MODEL", None)
    log = tmp_path / "jupyter.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port=0",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        # If this test process dies without its finalizer, the server still goes away by itself:
        "--ServerApp.shutdown_no_activity_timeout=120",
        "--MappingKernelManager.cull_idle_timeout=120",
        "--MappingKernelManager.cull_interval=30",
        "--MappingKernelManager.cull_connected=True",
        # Nothing reaches for the network: no news feed, no update check, no PyPI extension manager.
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        "--ServerApp.terminals_enabled=False",
    ]
    if os.geteuid() == 0:  # CI containers run as root
        cmd.append("--allow-root")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = None
    request.addfinalizer(lambda: _stop(proc, url, token, root, dirs["runtime"]))
    server = Server("", token, root, proc, log)

    deadline = time.monotonic() + SERVER_START_S
    while url is None:
        if proc.poll() is not None:
            pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{server.log_tail()}", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"JupyterLab did not start in {SERVER_START_S} s:\n{server.log_tail()}", pytrace=False)
        for info in Path(dirs["runtime"]).glob("jpserver-*.json"):
            try:
                url = json.loads(info.read_text())["url"]  # written once the port is bound
            except (ValueError, KeyError):
                pass
        time.sleep(0.2)
    url = url if url.endswith("/") else url + "/"
    while True:
        try:
            urllib.request.urlopen(f"{url}api/status?token={token}", timeout=5).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"JupyterLab does not answer at {url}:\n{server.log_tail()}", pytrace=False)
            time.sleep(0.2)
    server.url = url
    return server


@pytest.fixture
def page(needs_browser, request):
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    request.addfinalizer(pw.stop)  # also ends the browser, should browser.close() not get to run
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
    request.addfinalizer(browser.close)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(UPDATE_S * 1000)
    return page


# --- the test ---------------------------------------------------------------------------------


def _shown_png(image) -> tuple[str, str, int]:
    """The widget image's src, the sha256 of the PNG bytes behind it, and its decoded width in
    pixels (0 when the browser could not decode it)."""
    src, data, width = image.evaluate("""async (img) => {
        const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
        let s = ""; for (const b of bytes) s += String.fromCharCode(b);
        await img.decode().catch(() => {});
        return [img.src, btoa(s), img.naturalWidth];
    }""")
    return src, hashlib.sha256(base64.b64decode(data)).hexdigest(), width


def _wait_for_picture(image, pictures: list[str], step: int, timeout_s: float = UPDATE_S) -> str:
    """Wait until the page's image is the PNG of ``step``; return its src. The step text arrives
    before the figure (which takes longer to draw), so the text alone does not say the picture is
    there yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        src, digest, _ = _shown_png(image)
        if digest == pictures[step]:
            return src
        if time.monotonic() > deadline:
            shown = pictures.index(digest) if digest in pictures else "none of the run's steps"
            pytest.fail(
                f"the page's figure should show step {step} after {timeout_s} s; it shows {shown}", pytrace=False
            )
        time.sleep(0.2)


def _outputs_text(page) -> str:
    """Every output of the notebook, for a failure message."""
    texts = page.locator(".jp-OutputArea-output").all_inner_texts()
    return "\n---\n".join(t.strip()[-2000:] for t in texts) or "(no outputs)"


@pytest.mark.slow
@pytest.mark.timeout(240)  # a backstop only: every wait below has its own, shorter timeout
def test_slots_timeline_in_jupyterlab(needs_browser, jupyter_server, page, tmp_path, record_property):
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect

    expect.set_options(timeout=UPDATE_S * 1000)
    start = time.perf_counter()
    server = jupyter_server
    screenshot = tmp_path / "jupyterlab-slots-timeline.png"
    try:
        page.goto(f"{server.url}lab/tree/timeline.ipynb?token={server.token}", timeout=60_000)
        # Run All before the kernel is up does nothing: wait for "Python 3 (browser test) | Idle".
        page.locator(".jp-StatusBar-TextItem", has_text="| Idle").wait_for(timeout=60_000)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

        widget = page.locator(".jp-OutputArea-output .widget-vbox").first
        image = widget.locator("img.widget-image")
        info = widget.locator(".widget-html pre")
        readout = widget.locator(".widget-slider .widget-readout")
        expected = page.locator(".jp-OutputArea-output", has_text="PNG_SHA256")
        error = page.locator(".jp-OutputArea-output", has_text="Traceback")
        expected.or_(error).first.wait_for(timeout=RENDER_S * 1000)
        if error.count():
            pytest.fail(f"a notebook cell raised:\n{_outputs_text(page)}", pytrace=False)
        pictures = json.loads(expected.inner_text().split("PNG_SHA256", 1)[1])
        assert len(pictures) == 4, f"the two-slot example should take 4 continuous-batching steps, not {len(pictures)}"
        assert len(set(pictures)) == 4, "every step should draw a different picture (the outline moves)"

        # The widget as rendered: play button, slider at 0, the figure decoded by the browser, step text.
        expect(widget.locator(".widget-play button")).to_have_count(3)
        expect(readout).to_have_text("0")
        expect(info).to_contain_text("step 0")
        src0 = _wait_for_picture(image, pictures, 0)
        width = image.evaluate("img => img.naturalWidth")
        assert width > 100, f"the browser did not decode the figure (naturalWidth={width})"

        # The slider: focus its handle and step right with the keyboard, as a learner can.
        handle = widget.locator(".widget-slider .noUi-handle")
        handle.focus()
        handle.press("ArrowRight")
        expect(readout).to_have_text("1")
        expect(info).to_contain_text("step 1")
        src1 = _wait_for_picture(image, pictures, 1)
        assert src1 != src0

        # Play runs from the current step to the last one and stops there.
        widget.locator(".widget-play button").first.click()
        expect(readout).to_have_text("3")
        expect(info).to_contain_text("step 3")
        expect(info).to_contain_text("finished")
        src3 = _wait_for_picture(image, pictures, 3)
        assert src3 not in (src0, src1)
    except PlaywrightError as e:
        pytest.fail(
            f"{e}\n\nnotebook outputs:\n{_outputs_text(page)}\n\nJupyterLab log:\n{server.log_tail()}", pytrace=False
        )
    finally:
        try:
            page.screenshot(path=str(screenshot), full_page=True, timeout=10_000)
            print(f"\nscreenshot: {screenshot}")
        except Exception:
            pass
    elapsed = time.perf_counter() - start
    record_property("runtime_s", round(elapsed, 1))
    print(f"browser test: {elapsed:.1f} s from opening the notebook to the last redraw")
