"""`workbench serve` in a real headless Chromium (Debian's chromium and chromium-driver, driven by selenium), against
the real command in a subprocess on a free port (--port 0) and a tmp runs directory.

Reading the screen: textual-serve draws the terminal with xterm.js on a canvas (its WebGL or canvas renderer), so
the page's DOM has no text. The test reads xterm.js's own buffer through its public API
(``terminal.buffer.active.getLine(i).translateToString()``): the cells the user sees, as text. textual-serve keeps
its Terminal in a closure, as ``this.terminal`` of its page object, so a script that the browser runs before the
page's own (CDP's Page.addScriptToEvaluateOnNewDocument) puts a setter for ``terminal`` on Object.prototype that
keeps the Terminal in ``window.__xterm`` when textual.js assigns it (and then stores it as the object's own
property, so the page works as before). Keys go where a user's do: typed into xterm.js's input textarea.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.support.cli import wb
from tests.support.runs import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

HOOK = """
Object.defineProperty(Object.prototype, 'terminal', {configurable: true, set(v) {
  Object.defineProperty(this, 'terminal', {value: v, writable: true, configurable: true, enumerable: true});
  if (v && v.buffer && v.onData) window.__xterm = v;
}});
"""
SCREEN = """const t = window.__xterm; if (!t) return null; const b = t.buffer.active, rows = [];
for (let i = 0; i < t.rows; i++) {
  const l = b.getLine(b.viewportY + i); rows.push(l ? l.translateToString(true) : '');
}
return rows.join('\\n');"""


@pytest.fixture(scope="module")
def browser():
    # missing is a failure, not a skip: CI must not go green without this test (.ci/run installs them)
    for path in (CHROMIUM, CHROMEDRIVER):
        assert os.access(path, os.X_OK), f"{path} is missing: apt-get install chromium chromium-driver"
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": HOOK})
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


class Served:
    """`workbench serve ARGS` in a subprocess; ``url`` is the one it printed."""

    def __init__(self, tmp_path: Path, *args: str):
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   PYTHONUNBUFFERED="1", WORKBENCH_PRESETS_DIR=str(tmp_path / "presets"))
        env.pop("WORKBENCH_SERVE_TOKEN", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "workbench", "serve", "--port", "0", *args,
                                      "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.first = self.proc.stdout.readline()
        found = re.search(r"http://\S+", self.first)
        assert found, f"no URL in {self.first!r} (exit {self.proc.poll()})"
        self.url = found.group(0)
        self.port = int(re.search(r":(\d+)/", self.url).group(1))

    def local(self, path: str = "/") -> str:
        """``path`` on this server through loopback (what a browser at the far end of a tunnel asks for)."""
        return f"http://127.0.0.1:{self.port}{path}"

    def apps(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children()  # one per open tab

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=20)
        return out


class Tunnel:
    """What `ssh -L LOCAL:localhost:PORT box` gives the browser: another local port, whose connections are carried
    to PORT (the page must then take its websocket's address from the request, not from the server's own port)."""

    def __init__(self, port: int):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port, self.target = self.server.getsockname()[1], port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.server.accept()
            except OSError:
                return
            far = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._carry, args=(a, b), daemon=True).start()

    @staticmethod
    def _carry(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()


def screen(driver, *, has: str, lacks: str | None = None, timeout: float = 30) -> str:
    """The terminal's text once it shows ``has`` (and not ``lacks``)."""
    def ready():
        text = driver.execute_script(SCREEN)
        return text if text and has in text and (lacks is None or lacks not in text) else None
    try:
        return wait_until(ready, timeout, f"the page's terminal to show {has!r}")
    except AssertionError as e:
        raise AssertionError(f"{e}; it shows:\n{driver.execute_script(SCREEN)}") from None


def status(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def websocket_status(url: str, headers: dict[str, str] | None = None) -> int:
    """The HTTP status of a websocket handshake with ``url`` (101: opened, then closed at once)."""
    import aiohttp

    async def go() -> int:
        async with aiohttp.ClientSession() as s:
            try:
                async with s.ws_connect(url, headers=headers or {}):
                    return 101
            except aiohttp.WSServerHandshakeError as e:
                return e.status
    return asyncio.run(go())


def maps_torch(pid: int) -> bool:
    return "torch" in Path(f"/proc/{pid}/maps").read_text()


def test_the_tui_in_a_browser_on_localhost(browser, tmp_path):
    srv = Served(tmp_path)
    try:
        assert srv.url == f"http://127.0.0.1:{srv.port}/", srv.first
        assert f"ssh -L {srv.port}:localhost:{srv.port}" in srv.proc.stdout.readline()
        browser.get(srv.url)
        first = screen(browser, has="Recommended preset:")
        assert re.search(r"Recommended preset: \S+ .*press t to start a run with it", first), first
        assert "1 Hardware" in first and "RAM" in first
        (app,) = srv.apps()  # the tab's own `workbench` process, with no torch in it (nor in the server)
        assert app.cmdline()[1:3] == ["-m", "workbench"] and "serve" not in app.cmdline()
        assert not maps_torch(app.pid) and not maps_torch(srv.proc.pid)

        browser.find_element("css selector", ".xterm-helper-textarea").send_keys("2")
        presets = screen(browser, has="[shipped]", lacks="Recommended preset:")
        assert "─ presets ─" in presets and "cpu-small [shipped]" in presets, presets

        # the page is whole without the internet (its font is textual-serve's copy), and works through a tunnel
        code, page = status(srv.local())
        assert code == 200 and "googleapis" not in page and "<title>workbench</title>" in page
        assert status(srv.local("/static/fonts/RobotoMono-VariableFont_wght.ttf"))[0] == 200
        tunnel = Tunnel(srv.port)
        try:
            browser.get(f"http://localhost:{tunnel.port}/")
            screen(browser, has="Recommended preset:")
            assert browser.title == "workbench"
        finally:
            tunnel.close()

        # loopback without a token: only names of this machine, and the websocket only from its own page
        assert status(srv.local(), {"Host": f"rebound.example:{srv.port}"})[0] == 403
        ws = srv.local("/ws").replace("http", "ws", 1)
        assert websocket_status(ws, {"Origin": "http://evil.example"}) == 403
    finally:
        out = srv.stop()
    assert srv.proc.returncode == 0, out
    wait_until(lambda: not app.is_running() or app.status() == psutil.STATUS_ZOMBIE, 10, "the tab's app to end")


def test_off_localhost_a_request_needs_the_token(browser, tmp_path):
    srv = Served(tmp_path, "--host", "0.0.0.0")
    try:
        token = re.search(r"\?token=([\w-]+)", srv.url).group(1)
        assert len(token) >= 16, srv.url
        for path in ("/", "/static/js/textual.js", "/ws"):
            code, body = status(srv.local(path))
            assert code == 403 and "access token" in body, (path, code, body)
        assert status(srv.local("/?token=not-" + token))[0] == 403
        assert websocket_status(srv.local("/ws").replace("http", "ws", 1)) == 403
        assert srv.apps() == []  # no app was started for any of them

        browser.get(srv.local())
        assert "access token" in browser.find_element("tag name", "body").text
        browser.get(srv.local(f"/?token={token}"))  # the page sets the cookie its static files and websocket carry
        screen(browser, has="Recommended preset:")
        assert len(srv.apps()) == 1
        status_code, page = status(srv.local(f"/?token={token}"))
        assert status_code == 200 and "textual-terminal" in page
    finally:
        out = srv.stop()
    assert srv.proc.returncode == 0, out


def test_a_token_given_on_loopback_is_required_there_too(tmp_path):
    """`serve --token T` on 127.0.0.1: every request needs T (a request without it, or with another, is refused and
    starts no app); the URL printed carries it."""
    srv = Served(tmp_path, "--host", "127.0.0.1", "--token", "given-token-42")
    try:
        assert srv.url.endswith("?token=given-token-42"), srv.url
        assert status(srv.local("/"))[0] == 403 and status(srv.local("/?token=given-token-4"))[0] == 403
        code, page = status(srv.local("/?token=given-token-42"))
        assert code == 200 and "textual-terminal" in page
        assert srv.apps() == []   # the page alone starts no app (its websocket would)
    finally:
        out = srv.stop()
    assert srv.proc.returncode == 0, out


def test_bad_inputs_get_one_line_and_exit_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        cases = {("--port", port): f"port {port} on 127.0.0.1 is in use",
                 ("--host", "no-such-host.invalid"): "is not an address or a name this machine can resolve",
                 ("--port", "70000"): "is not a port number",
                 ("--token", "short"): "must be at least 8 printable characters"}
        for args, says in cases.items():
            r = wb("serve", *args, "--runs-dir", str(tmp_path / "runs"), timeout=60, fresh=True)
            assert r.returncode == 2 and says in r.stderr, (args, r.returncode, r.stderr)
            assert r.stderr.strip().splitlines()[-1].startswith(("workbench: error:", "workbench serve: error:"))
            assert r.stdout == ""
    assert not (tmp_path / "runs").exists()
