"""A PostgreSQL server of its own, for the tests and benches that need one (tests/queue/test_sweep_postgres.py,
bench/queue_scale.py): initdb and pg_ctl in a temporary directory on a free port, password authentication, a
database ``sweeps`` for user ``wb``; stopped and removed at the end. initdb refuses root: as root, the server runs
as the ``postgres`` user, or ``nobody``."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

PASSWORD = "pw-Zq81-secret"


class NoPostgres(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_user(cmd: list[str], user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@contextlib.contextmanager
def postgres_server() -> Iterator[dict]:
    """{"url": postgresql://wb:PASSWORD@127.0.0.1:PORT/sweeps, "port": PORT, "stop"/"start": the server stopped
    (as a lost database is) and started again on the same data} while the server runs."""
    found = [shutil.which("initdb")] + sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    initdb = next((t for t in found if t), None)
    if initdb is None:
        raise NoPostgres("PostgreSQL's initdb is not installed: apt-get install postgresql (.ci/run does)")
    pg_ctl = str(Path(initdb).with_name("pg_ctl"))
    user = None
    if os.geteuid() == 0:
        user = next(u for u in ("postgres", "nobody") if _has_user(u))
    base = Path(tempfile.mkdtemp(prefix="wb-pg-"))
    if user:
        pw = pwd.getpwnam(user)
        os.chown(base, pw.pw_uid, pw.pw_gid)
    (base / "pw").write_text(PASSWORD)
    if user:
        os.chown(base / "pw", pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
    data, port = base / "data", free_port()
    subprocess.run(_as_user([initdb, "-D", str(data), "-U", "wb", "--pwfile", str(base / "pw"), "-A",
                             "scram-sha-256", "--no-sync", "-E", "UTF8"], user), check=True, capture_output=True)
    opts = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"

    def start() -> None:
        subprocess.run(_as_user([pg_ctl, "-D", str(data), "-o", opts, "-l", str(base / "log"), "-w", "start"], user),
                       check=True, capture_output=True)

    def stop() -> None:
        subprocess.run(_as_user([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], user),
                       capture_output=True)

    start()
    try:
        import psycopg
        with psycopg.connect(host="127.0.0.1", port=port, user="wb", password=PASSWORD, dbname="postgres",
                             autocommit=True) as c:
            c.execute("CREATE DATABASE sweeps")
        yield {"url": f"postgresql://wb:{PASSWORD}@127.0.0.1:{port}/sweeps", "port": port, "stop": stop,
               "start": start}
    finally:
        stop()
        shutil.rmtree(base, ignore_errors=True)
