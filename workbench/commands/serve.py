"""`workbench serve`: the terminal UI in a web browser (textual-serve), for a box reached over ssh.

Each browser tab that opens the page starts its own `workbench` TUI process (textual-serve's model: the page is
xterm.js, the websocket carries the app's terminal output and the keys), on the same runs directory; the trainer is
not touched. Bound to 127.0.0.1 by default: another machine reaches it through an ssh tunnel. Bound anywhere else
it takes an access token (generated, or --token / $WORKBENCH_SERVE_TOKEN), which every request must carry, as
``?token=`` or the cookie the first page sets; one without gets 403. textual-serve has no access control of its own:
the checks are an aiohttp middleware on its application (see :func:`_guard`).
"""

from __future__ import annotations

import argparse
import errno
import hmac
import ipaddress
import os
import re
import secrets
import shlex
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from workbench.errors import WorkbenchError

COOKIE = "workbench_token"
TOKEN_ENV = "WORKBENCH_SERVE_TOKEN"
MIN_TOKEN = 8
# names a browser uses for this machine when the server is bound to loopback (a tunnel's local end included);
# any other Host header is a page on another site that resolved its name to 127.0.0.1 (DNS rebinding)
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number: give one from 1 to 65535 (0: any free port)")
    return port


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve", help="serve the terminal UI to a web browser (localhost by default; reach it over an ssh tunnel)",
        description="Serve the terminal UI to a web browser: each browser tab runs its own `workbench` UI on the "
                    "runs directory. Bound to 127.0.0.1 by default; from another machine, tunnel to it with "
                    "`ssh -L 8000:localhost:8000 BOX` and open http://localhost:8000/. Bound to any other address, "
                    "every request needs the access token printed at start (or --token).")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface, "
                        "with a token)")
    p.add_argument("--port", type=port_number, default=8000,
                   help="the port to listen on (default 8000; 0: any free one)")
    p.add_argument("--token",
                   help=f"the access token a browser must give (default ${TOKEN_ENV}, else one generated and printed "
                        "when --host is not a loopback address; given on loopback, it is required there too)")
    p.set_defaults(func=run)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port``, or a WorkbenchError that says why not and what to do."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise WorkbenchError(f"--host {host!r} is not an address or a name this machine can resolve ({e}): "
                             "use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not a second listener: only TIME_WAIT reuse
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise WorkbenchError(f"port {port} on {host} is in use (another `workbench serve`?): "
                                 "pick another with --port, or stop the one that has it") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise WorkbenchError(f"--host {host} is not an address of this machine: use 127.0.0.1 or 0.0.0.0, or one "
                                 "that `ip addr` lists") from None
        if e.errno == errno.EACCES:
            raise WorkbenchError(f"not allowed to listen on port {port} (ports below 1024 need root): use --port 8000 "
                                 "or another above 1023") from None
        raise WorkbenchError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.setblocking(False)
    return sock


def _is_loopback(sock: socket.socket) -> bool:
    return ipaddress.ip_address(sock.getsockname()[0].split("%")[0]).is_loopback


def _hostname(host_header: str) -> str:
    """The name in a Host (or Origin netloc) header, without the port or an IPv6 address's brackets."""
    return (urlsplit("//" + host_header).hostname or "").lower()


def _guard(token: str | None, loopback: bool, cookie: str) -> Any:
    """The aiohttp middleware that stands in front of textual-serve's routes (the page, its static files, the
    websocket that runs the app).

    - With a token, a request carries it as ``?token=`` or in the cookie that a page opened with it sets (the
      websocket and the static files then carry the cookie, one per port: a browser shares cookies between a host's
      ports, so two servers on one box each keep their own); without, 403 and a line saying where the token is.
    - The websocket's Origin, when a browser sends one, must be this server's own: another site's page cannot
      open a session (a browser lets any page open a websocket to localhost).
    - Bound to loopback with no token, the Host must be a loopback name (no DNS rebinding through a browser).
    """
    from aiohttp import web

    def refuse(why: str) -> web.HTTPForbidden:
        return web.HTTPForbidden(text=f"403 Forbidden: {why}\n")

    def valid(given: str | None) -> bool:
        return given is not None and token is not None and hmac.compare_digest(given.encode(), token.encode())

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        if token is None and loopback and _hostname(request.host) not in LOOPBACK_NAMES:
            raise refuse(f"this server answers to localhost only, not {request.host!r}")
        origin = request.headers.get("Origin")
        if request.path == "/ws" and origin and urlsplit(origin).netloc.lower() != request.host.lower():
            raise refuse(f"a page from {origin} may not open a session here")
        from_query = request.query.get("token")
        if token is not None and not (valid(from_query) or valid(request.cookies.get(cookie))):
            raise refuse("this workbench needs its access token: open the URL that `workbench serve` printed "
                         "(it ends in ?token=...)")
        response = await handler(request)
        if valid(from_query) and not isinstance(response, web.WebSocketResponse):
            response.set_cookie(cookie, token, httponly=True, samesite="Strict", path="/")
        return response

    return guard


def _own_page(page: str) -> str:
    """textual-serve's page, self-contained: its font from the copy textual-serve ships, not from Google's servers
    (a box's UI should not tell a third party each time it is opened, nor wait on one offline), and a title."""
    font = ('<style>@font-face { font-family: "Roboto Mono"; '
            'src: url("{{ config.static.url }}fonts/RobotoMono-VariableFont_wght.ttf"); }</style>')
    page = re.sub(r"<link[^>]*fonts\.googleapis\.com[^>]*>", lambda _: font, page)
    return page.replace("<head>", "<head>\n    <title>workbench</title>", 1)


def _server(command: str, token: str | None, loopback: bool, port: int) -> Any:
    """textual-serve's Server, with the guard in front, the page's URLs taken from the request (they work behind
    an ssh tunnel on any local port) and its banner replaced by ours."""
    import asyncio

    import aiohttp_jinja2
    import jinja2
    from aiohttp import WSCloseCode, web
    from textual_serve.app_service import AppService
    from textual_serve.server import Server, to_int

    sockets: set[web.WebSocketResponse] = set()  # the open tabs

    class WorkbenchServer(Server):
        async def _make_app(self) -> web.Application:
            app = await super()._make_app()
            app.middlewares.append(_guard(token, loopback, f"{COOKIE}_{port}"))
            page = (Path(self.templates_path) / "app_index.html").read_text()
            aiohttp_jinja2.setup(app, loader=jinja2.DictLoader({"app_index.html": _own_page(page)}))
            return app

        async def on_startup(self, app: web.Application) -> None:
            pass

        async def on_shutdown(self, app: web.Application) -> None:
            """Ctrl+C or SIGTERM: close every tab's websocket, which ends its app (else aiohttp waits for them)."""
            await asyncio.gather(*(ws.close(code=WSCloseCode.GOING_AWAY, message=b"server stopped")
                                   for ws in list(sockets)))

        def initialize_logging(self) -> None:
            pass

        @aiohttp_jinja2.template("app_index.html")
        async def handle_index(self, request: web.Request) -> dict[str, Any]:
            ws = "wss" if request.scheme == "https" else "ws"
            return {
                "font_size": to_int(request.query.get("fontsize", "16"), 16),
                "app_websocket_url": f"{ws}://{request.host}{request.app.router['websocket'].url_for()}",
                "config": {"static": {"url": "/static/"}},
                "application": {"name": self.title},
            }

        async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
            """One browser tab's app: textual-serve's handler, which also waits for the app's process to end
            (killed if it has not 5 s after its quit), so none outlives its tab or the server."""
            websocket = web.WebSocketResponse(heartbeat=15)
            width = to_int(request.query.get("width", "80"), 80)
            height = to_int(request.query.get("height", "24"), 24)
            await websocket.prepare(request)
            sockets.add(websocket)
            service = AppService(self.command, write_bytes=websocket.send_bytes, write_str=websocket.send_str,
                                 # close: textual-serve's own handler passes the same; its Awaitable[None] is
                                 # narrower than aiohttp's close (a bool the service never reads)
                                 close=websocket.close,  # type: ignore[arg-type]
                                 download_manager=self.download_manager)
            try:
                await service.start(width, height)
                await self._process_messages(websocket, service)
            except asyncio.CancelledError:
                pass  # the server is stopping
            finally:
                await service.stop()
                if (process := service._process) is not None:
                    try:
                        await asyncio.wait_for(process.wait(), 5)
                    except TimeoutError:
                        process.kill()
                        await process.wait()
                await websocket.close()
                sockets.discard(websocket)
            return websocket

    return WorkbenchServer(command, title="workbench")


def _urls(sock: socket.socket, host: str, token: str | None, loopback: bool) -> list[str]:
    """What to tell the user: where to point a browser, and how to get there from another machine."""
    bound, port = sock.getsockname()[:2]
    query = f"?token={quote(token)}" if token else ""
    if loopback:
        name = "localhost" if host == "localhost" else (f"[{bound}]" if ":" in bound else bound)
        return [f"workbench serve: open http://{name}:{port}/{query} in a browser on this machine "
                "(each tab runs its own UI; Ctrl+C stops them all)",
                f"from another machine: ssh -L {port}:localhost:{port} THIS-BOX, then open "
                f"http://localhost:{port}/{query} there"]
    shown = socket.gethostname() if ipaddress.ip_address(bound.split("%")[0]).is_unspecified else (
        f"[{bound}]" if ":" in bound else bound)
    return [f"workbench serve: open http://{shown}:{port}/{query} (listening on {host}:{port}; each tab runs its own "
            "UI; Ctrl+C stops them all)",
            "every request needs the token: keep the URL private; plain http, so only on a network you trust "
            f"(or bind to 127.0.0.1 and use ssh -L {port}:localhost:{port} THIS-BOX)"]


def run(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if token is not None and (len(token) < MIN_TOKEN or not token.isprintable() or " " in token):
        raise WorkbenchError(f"--token (or ${TOKEN_ENV}) must be at least {MIN_TOKEN} printable characters without "
                             "spaces (or leave both out for a generated one)")
    sock = _listen(args.host, args.port)
    loopback = _is_loopback(sock)
    if token is None and not loopback:
        token = secrets.token_urlsafe(18)
    runs_dir = Path(args.runs_dir).resolve()
    # the app runs as bare `workbench` in a process of its own, started by textual-serve (through /bin/sh: exec, so
    # the process it waits for and signals is the app's) for each browser tab
    command = "exec " + shlex.join([sys.executable, "-m", "workbench", "--runs-dir", str(runs_dir)])
    server = _server(command, token, loopback, sock.getsockname()[1])
    from aiohttp import web

    for line in _urls(sock, args.host, token, loopback):
        print(line, flush=True)
    # SIGINT/SIGTERM end the server; the websockets' handlers then send each app its quit
    web.run_app(server._make_app(), sock=sock, print=None, handle_signals=True, shutdown_timeout=5)
    return 0
