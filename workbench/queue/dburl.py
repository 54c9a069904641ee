"""The shared study database a sweep over several machines lives in (``--storage URL``): the user's URL made
SQLAlchemy's (postgresql:// through psycopg 3, mysql:// through PyMySQL), masked wherever it is shown, a SQLite
path on a network filesystem refused, and Optuna's RDBStorage opened with heartbeats and one retry of a dead
worker's trial; a database that cannot be used is one line. Torch-free; Optuna and SQLAlchemy loaded when used."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from workbench.queue import sweep as local
from workbench.queue.store import QueueError

HEARTBEAT_S = 10          # a worker's heartbeat, Optuna's heartbeat_interval
GRACE_FACTOR = 3          # a trial is stale after GRACE_FACTOR heartbeats without one (Optuna's grace_period)
MAX_RETRY = 1             # a trial failed by heartbeat is tried again once
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "lustre", "glusterfs", "ceph",
              "fuse.glusterfs", "fuse.cephfs", "beegfs", "gpfs", "afs"}


class StorageError(QueueError):
    pass


def masked(url: str) -> str:
    """``url`` with its password as ``***`` (what every message shows)."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def _scrub(text: str, url: str) -> str:
    m = re.search(r"://[^:/@]*:([^@]*)@", url)
    return text.replace(m.group(1), "***") if m and m.group(1) else text


MOUNTS = Path("/proc/mounts")


def mount_type(path: Path, mounts_file: Path = MOUNTS) -> str:
    """The filesystem type ``mounts_file`` (/proc/mounts) gives the mount ``path`` is on ("" where it cannot be
    read)."""
    try:
        mounts = [line.split()[1:3] for line in Path(mounts_file).read_text().splitlines() if len(line.split()) > 2]
    except OSError:
        return ""
    p = Path(path).resolve()
    best, kind = "", ""
    for point, fstype in mounts:
        point = point.replace("\\040", " ")
        if (str(p) == point or str(p).startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fstype
    return kind


def engine_url(url: str, mounts_file: Path = MOUNTS) -> str:
    """The SQLAlchemy URL for a user's database URL: postgresql:// through psycopg 3, mysql:// through PyMySQL;
    a sqlite:/// path on a network filesystem refused (SQLite's locks do not hold there)."""
    scheme, sep, rest = url.partition("://")
    if not sep or not rest:
        raise StorageError(f"--storage {masked(url)} is not a database URL; give postgresql://USER:PASSWORD@HOST"
                           ":PORT/DATABASE (or mysql://..., or sqlite:///PATH for one machine)")
    base = scheme.split("+")[0]
    if base in ("postgresql", "postgres"):
        return f"postgresql+{scheme.split('+')[1] if '+' in scheme else 'psycopg'}://{rest}"
    if base == "mysql":
        return url if "+" in scheme else f"mysql+pymysql://{rest}"
    if base == "sqlite":
        path = Path(rest[1:] if rest.startswith("/") else rest)
        kind = mount_type(path, mounts_file)
        if kind in NETWORK_FS:
            raise StorageError(f"--storage {url}: {path} is on a network filesystem ({kind}), where SQLite's locks do "
                               "not hold and the database corrupts; use a PostgreSQL server (--storage "
                               "postgresql://USER:PASSWORD@HOST/DATABASE), or a path on a local disk")
        return url
    raise StorageError(f"--storage {masked(url)}: {scheme}:// is not a database this supports; give "
                       "postgresql://USER:PASSWORD@HOST:PORT/DATABASE (or mysql://..., or sqlite:///PATH)")


def _optuna() -> Any:
    return local._optuna()


def _why(e: BaseException, url: str) -> str:
    """One line for a failed connection: what is wrong and what to check (the password never shown)."""
    orig = getattr(e, "orig", None) or e
    text = _scrub(" ".join(str(orig).split()), url)
    if "password authentication failed" in text or "Access denied" in text:
        return (f"cannot log in to the database at {masked(url)}: the user or the password is wrong ({_first(text)});"
                " check the URL's USER:PASSWORD")
    if re.search(r'database "[^"]*" does not exist', text):
        return (f"the database at {masked(url)} does not exist ({_first(text)}); create it (createdb NAME) or name "
                "one that does")
    return (f"cannot reach the database at {masked(url)} ({_first(text)}); is the server running, and are the host "
            "and port right?")


def _first(text: str) -> str:
    """The driver's message, without its class and its own advice (the line gives ours)."""
    text = re.sub(r"^\(psycopg\.[A-Za-z]+\)\s*", "", text)
    text = re.split(r"\s+Is the server running|\s+\(Background on this error", text)[0]
    return text[:200]


def _readonly_args(eng: str) -> dict[str, Any]:
    """Connection arguments that make every transaction of a reader read-only (the server refuses a write)."""
    if eng.startswith("postgresql"):
        return {"options": "-c default_transaction_read_only=on"}
    if eng.startswith("mysql"):
        return {"init_command": "SET SESSION TRANSACTION READ ONLY"}
    return {}


def open_storage(url: str, heartbeat: int = HEARTBEAT_S, grace: int | None = None, readonly: bool = False) -> Any:
    """Optuna's RDBStorage on ``url``, with heartbeats (a stale trial is failed after ``grace`` seconds) and a
    dead trial retried once; one StorageError line when the database cannot be used. ``readonly`` (the TUI's
    Queue tab): no heartbeat, no table made, every transaction read-only on PostgreSQL and MySQL; a database
    without Optuna's tables is a StorageError saying no sweep was made there."""
    optuna = _optuna()
    import sqlalchemy.exc
    eng = engine_url(url)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if not eng.startswith("sqlite"):
        kwargs["connect_args"] = {"connect_timeout": 5, **(_readonly_args(eng) if readonly else {})}
    if readonly:
        try:
            engine = sqlalchemy.create_engine(eng, **kwargs)
            try:
                made = sqlalchemy.inspect(engine).has_table("studies")
            finally:
                engine.dispose()
            if not made:
                raise StorageError(f"no sweep in {masked(url)} yet (no Optuna study was ever made there); "
                                   "`workbench sweep PRESET --set-grid KEY=V1,V2 --storage URL` makes one")
            return optuna.storages.RDBStorage(eng, engine_kwargs=kwargs, skip_compatibility_check=True,
                                              skip_table_creation=True)
        except ModuleNotFoundError as e:
            raise StorageError(_no_driver(e, url)) from None
        except (sqlalchemy.exc.SQLAlchemyError, ValueError) as e:
            raise StorageError(_why(e, url)) from None
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    callback = {"heartbeat_stale_trial_callback": retry(max_retry=MAX_RETRY)} if retry else \
        {"failed_trial_callback": optuna.storages.RetryFailedTrialCallback(max_retry=MAX_RETRY)}
    try:
        return optuna.storages.RDBStorage(
            eng, engine_kwargs=kwargs, heartbeat_interval=heartbeat,
            grace_period=grace if grace is not None else GRACE_FACTOR * heartbeat, **callback)
    except ModuleNotFoundError as e:
        raise StorageError(_no_driver(e, url)) from None
    except (sqlalchemy.exc.SQLAlchemyError, ValueError) as e:
        raise StorageError(_why(e, url)) from None


def _no_driver(e: ModuleNotFoundError, url: str) -> str:
    return (f"the database driver for {masked(url)} is not installed ({e.name}); "
            f"pip install {'psycopg[binary]' if 'psycopg' in str(e.name) else e.name}")
