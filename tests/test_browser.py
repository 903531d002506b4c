"""A learner's JupyterLab, a real Chromium, a real widget, checked picture by picture.

Everything else about the widgets is tested as state (``test_widgets.py``). This test checks what
only a browser can: that JupyterLab renders ``slots_timeline`` from a live kernel (play button,
slider, figure, step text), and that moving the slider with the keyboard and pressing play change
the step text and put exactly that step's picture in the page (the PNG bytes the image shows are
compared with the ones the kernel draws for each step).

The test starts JupyterLab on a notebook it writes and drives Debian's Chromium
(``tests/jupyterlab.py``: loopback only, stopped at the end, passed or failed). It needs ``apt-get
install chromium`` and ``pip install playwright`` (in the ``dev`` extra); never ``playwright
install``. Without them it skips, except under ``CI=true``, where it fails. Every chapter notebook
runs in the browser too (``test_notebooks.py``); this test checks one widget exactly. A
screenshot of the final page is kept in the test's tmp directory (printed with ``-s``).

    python -m pytest tests/test_browser.py -s
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.jupyterlab import launch_chromium, notebook_json, outputs_text, require_browser, shown_png, start_jupyterlab

RENDER_S = 60  # kernel start, torch import, the run and the widget's first render
UPDATE_S = 15  # one redraw after a slider move

NOTEBOOK_CELLS = [
    ("markdown", "# Browser test\nA real continuous-batching run of the tiny model, shown as a slots timeline."),
    ("code", "from minillm import LLM, workloads\nfrom minillm.widgets import slots_timeline"),
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


@pytest.fixture
def jupyter_server(tmp_path: Path):
    require_browser()
    root = tmp_path / "root"
    root.mkdir()
    (root / "timeline.ipynb").write_text(json.dumps(notebook_json(NOTEBOOK_CELLS), indent=1))
    env = {"MINILLM_SMALL": "1", "MPLBACKEND": "Agg", "OMP_WAIT_POLICY": "PASSIVE"}
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    server = start_jupyterlab(tmp_path, root, env)
    yield server
    server.stop()


@pytest.fixture
def page(jupyter_server, request):
    page = launch_chromium(request).new_page()
    page.set_default_timeout(UPDATE_S * 1000)
    return page


# --- the test ---------------------------------------------------------------------------------


def _wait_for_picture(image, pictures: list[str], step: int, timeout_s: float = UPDATE_S) -> str:
    """Wait until the page's image is the PNG of ``step``; return its src. The step text arrives
    before the figure (which takes longer to draw), so the text alone does not say the picture is
    there yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        src, digest, _ = shown_png(image)
        if digest == pictures[step]:
            return src
        if time.monotonic() > deadline:
            shown = pictures.index(digest) if digest in pictures else "none of the run's steps"
            pytest.fail(
                f"the page's figure should show step {step} after {timeout_s} s; it shows {shown}", pytrace=False
            )
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(240)  # a backstop only: every wait below has its own, shorter timeout
def test_slots_timeline_in_jupyterlab(jupyter_server, page, tmp_path, record_property):
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
            pytest.fail(f"a notebook cell raised:\n{outputs_text(page)}", pytrace=False)
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
            f"{e}\n\nnotebook outputs:\n{outputs_text(page)}\n\nJupyterLab log:\n{server.log_tail()}", pytrace=False
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
