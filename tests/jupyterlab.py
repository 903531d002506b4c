"""A learner's JupyterLab and a real Chromium, for the browser tests (``test_browser.py``,
``test_notebooks.py``).

``start_jupyterlab`` runs JupyterLab on 127.0.0.1 (a free port, a token, the given root folder,
config / data / runtime directories of its own and a kernel that runs this interpreter); ``stop``
ends it and its kernels, also when a test fails. ``launch_chromium`` drives Debian's Chromium with
Playwright (never ``playwright install``). Without Playwright or Chromium ``require_browser`` skips
the test, except under ``CI=true``, where it fails.
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
from dataclasses import dataclass, field
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

# JupyterLab's settings for the tests: every cell rendered (no virtual scrolling, so a widget far down
# the notebook is in the page), the kernel's timing of each cell kept in the saved notebook, no
# autosave, and no news or update checks (nothing may reach for the network, no toast covers the page).
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none", "recordTiming": True},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


def require_browser() -> None:
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
        message = "the browser tests need " + " and ".join(missing) + "; never run `playwright install`"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message)


def _jupyter_dirs(tmp: Path) -> dict[str, Path]:
    """Config, data and runtime directories of our own: the user's settings, workspaces, kernels
    and running servers are neither read nor touched."""
    dirs = {name: tmp / name for name in ("config", "data", "runtime", "ipython")}
    for d in dirs.values():
        d.mkdir(parents=True)
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
    for plugin, values in SETTINGS.items():
        package, name = plugin.rsplit("/", 1)
        folder = dirs["config"] / "lab" / "user-settings" / package
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.jupyterlab-settings").write_text(json.dumps(values))
    return dirs


def notebook_json(cells: list[tuple[str, str]]) -> dict:
    """A notebook of ``(kind, source)`` cells that runs on the test's kernel."""
    out = []
    for i, (kind, source) in enumerate(cells):
        cell = {"cell_type": kind, "id": f"cell-{i}", "metadata": {}, "source": source}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        out.append(cell)
    return {
        "cells": out,
        "metadata": {"kernelspec": kernelspec(), "language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def kernelspec() -> dict:
    return {"name": KERNEL_NAME, "display_name": "Python 3 (browser test)", "language": "python"}


@dataclass
class Server:
    url: str
    token: str
    root: Path
    proc: subprocess.Popen
    log: Path
    runtime: Path
    kernel_pids: list[int] = field(default_factory=list)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(
            f"{self.url}api/{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def remember_kernels(self) -> None:
        """Note the pids of the running kernels (``kernel.pid`` files written by the kernels'
        startup), so that ``stop`` can end any the server leaves behind."""
        for pid_file in self.root.glob("kernel-*.pid"):
            try:
                self.kernel_pids.append(int(pid_file.read_text()))
            except (OSError, ValueError):
                pass

    def shutdown_kernels(self) -> None:
        """Every kernel of this server, shut down (between notebooks, so each starts fresh)."""
        for kernel in self.api("kernels"):
            self.api(f"kernels/{kernel['id']}", method="DELETE")

    def stop(self) -> None:
        """Ask the server to shut down (it stops its kernels), then end its process group, then any
        kernel that is still alive."""
        self.remember_kernels()
        if self.proc.poll() is None and self.url:
            try:
                self.api("shutdown", method="POST")
                self.proc.wait(timeout=10)
            except Exception:
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        for pid in self.kernel_pids:  # kernels run in sessions of their own: the group kill misses them
            try:
                # Only our kernels: their connection files lie in our runtime directory (never a reused pid).
                if str(self.runtime).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def start_jupyterlab(tmp: Path, root: Path, env_extra: dict[str, str], lab_args: list[str] | None = None) -> Server:
    """JupyterLab serving ``root`` on a free loopback port; every kernel writes its pid into
    ``root`` (an IPython startup file) so that ``Server.stop`` can end it. Call ``stop`` when done.
    ``lab_args`` (run from ``root``) replace ``--ServerApp.root_dir=ROOT``: a learner's command line."""
    dirs = _jupyter_dirs(tmp)
    startup = dirs["ipython"] / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-pid.py").write_text(
        f"import os, pathlib\npathlib.Path({str(root)!r}, f'kernel-{{os.getpid()}}.pid').write_text(str(os.getpid()))\n"
    )
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update(
        JUPYTER_CONFIG_DIR=str(dirs["config"]),
        JUPYTER_DATA_DIR=str(dirs["data"]),
        JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
        IPYTHONDIR=str(dirs["ipython"]),
        HF_HUB_OFFLINE="1",
        PYDEVD_DISABLE_FILE_VALIDATION="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    env.pop("MINILLM_MODEL", None)  # the tests use the offline model
    env.pop("MINILLM_IMPL", None)  # check() grades exercises/, as it would for a learner
    env.update(env_extra)
    log = tmp / "jupyter.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port=0",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        *(lab_args if lab_args is not None else [f"--ServerApp.root_dir={root}"]),
        # If the test process dies without its finalizer, the server still goes away by itself:
        "--ServerApp.shutdown_no_activity_timeout=180",
        "--MappingKernelManager.cull_idle_timeout=180",
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
    server = Server("", token, root, proc, log, dirs["runtime"])
    try:
        server.url = _wait_for_url(server)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_for_url(server: Server) -> str:
    deadline = time.monotonic() + SERVER_START_S
    url = None
    while url is None:
        if server.proc.poll() is not None:
            pytest.fail(f"JupyterLab exited with {server.proc.returncode}:\n{server.log_tail()}", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"JupyterLab did not start in {SERVER_START_S} s:\n{server.log_tail()}", pytrace=False)
        for info in server.runtime.glob("jpserver-*.json"):
            try:
                url = json.loads(info.read_text())["url"]  # written once the port is bound
            except (ValueError, KeyError):
                pass
        time.sleep(0.2)
    url = url if url.endswith("/") else url + "/"
    while True:
        try:
            urllib.request.urlopen(f"{url}api/status?token={server.token}", timeout=5).close()
            return url
        except OSError:
            if time.monotonic() > deadline or server.proc.poll() is not None:
                pytest.fail(f"JupyterLab does not answer at {url}:\n{server.log_tail()}", pytrace=False)
            time.sleep(0.2)


def launch_chromium(request, width: int = 1280, height: int = 900):
    """A Playwright browser context on Debian's Chromium, closed by the test's finalizers."""
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    request.addfinalizer(pw.stop)  # also ends the browser, should browser.close() not get to run
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
    request.addfinalizer(browser.close)
    return browser.new_context(viewport={"width": width, "height": height})


def shown_png(image) -> tuple[str, str, int]:
    """A widget image's src, the sha256 of the PNG bytes behind it, and its decoded width in
    pixels (0 when the browser could not decode it)."""
    src, data, width = image.evaluate("""async (img) => {
        const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
        let s = ""; for (const b of bytes) s += String.fromCharCode(b);
        await img.decode().catch(() => {});
        return [img.src, btoa(s), img.naturalWidth];
    }""")
    return src, hashlib.sha256(base64.b64decode(data)).hexdigest(), width


def outputs_text(page) -> str:
    """Every output of the open notebook, for a failure message."""
    texts = page.locator(".jp-OutputArea-output").all_inner_texts()
    return "\n---\n".join(t.strip()[-2000:] for t in texts) or "(no outputs)"
