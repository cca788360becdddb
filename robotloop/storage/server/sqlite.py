"""One SQLite connection per thread, and a transaction as a `with` block: the plumbing under the bucket server's
stores (`BucketStore`, `CasStore`), which many request threads read and write at once. `PostgresDb` is the same
over PostgreSQL (`robotloop.database`), and `open_db` picks one from the ``--database`` option.

Example:
    ```python
    >>> db = ThreadLocalDb(root / "index.sqlite", timeout_s=60)
    >>> with db.tx(immediate=True) as conn:  # BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on an exception
    ...     conn.execute("INSERT INTO xorbs VALUES (?, ?)", (h, size))
    >>> db.conn().execute("SELECT COUNT(*) FROM xorbs").fetchone()  # this thread's connection, for reads
    ```
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from ...database import PgConnection, check_postgres_url, connect_postgres

DbConnection = sqlite3.Connection | PgConnection  # what a store's SQL runs on: both read as sqlite3's


class _PerThread:
    """A connection per thread (`conn`, made by `_connect` on first use) and `tx` on it: what `ThreadLocalDb` and
    `PostgresDb` share."""

    _local: threading.local

    def conn(self) -> DbConnection:
        """This thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    def _connect(self) -> DbConnection:
        raise NotImplementedError

    def tx(self, immediate: bool = False) -> Transaction:
        """A transaction on this thread's connection; `immediate` takes the write lock at its start, so checks
        made inside it cannot race other writers."""
        return Transaction(self.conn(), immediate)

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


class ThreadLocalDb(_PerThread):
    """Durable connections to one SQLite file (WAL, synchronous=FULL: a commit is on disk when it returns), one
    per thread, made on first use.

    `isolation_level=None`: transactions are ours (`tx`), so a batch is exactly one transaction and a writer can
    take the write lock up front (BEGIN IMMEDIATE) instead of failing to upgrade a read lock mid-transaction.
    `timeout_s` is how long a writer waits for another's lock; `foreign_keys` turns their checks on; `rows` makes
    rows `sqlite3.Row` (read by column name)."""

    def __init__(self, path: Path, timeout_s: float = 30.0, foreign_keys: bool = False, rows: bool = False) -> None:
        self.path, self.timeout_s, self.foreign_keys, self.rows = path, timeout_s, foreign_keys, rows
        self._local = threading.local()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        if self.foreign_keys:
            conn.execute("PRAGMA foreign_keys=ON")
        if self.rows:
            conn.row_factory = sqlite3.Row
        return conn


class Transaction:
    """`with` block = one transaction (SQLite's, or PostgreSQL's through `PgConnection`): COMMIT on success,
    ROLLBACK on any exception."""

    def __init__(self, conn: sqlite3.Connection | PgConnection, immediate: bool) -> None:
        self.conn, self.immediate = conn, immediate

    def __enter__(self) -> sqlite3.Connection | PgConnection:
        self.conn.execute("BEGIN IMMEDIATE" if self.immediate else "BEGIN")
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


class PostgresDb(_PerThread):
    """`ThreadLocalDb`'s interface over a PostgreSQL database (``--database postgresql://...``): one connection per
    thread (`robotloop.database.PgConnection`, which reads like sqlite3's), and `tx` the same `Transaction`, whose
    ``BEGIN IMMEDIATE`` takes `store`'s writer lock, shared by every replica on that database; its tables are in
    the schema `store`.

    Connects at once, so a wrong URL or credentials fail when the server starts, not at its first request.

    Raises:
        BadDatabaseUrl, DatabaseUnavailable.
    """

    def __init__(self, url: str, store: str) -> None:
        self.url, self.store = url, store
        self._local = threading.local()
        self.conn()

    def _connect(self) -> PgConnection:
        return connect_postgres(self.url, self.store)


def open_db(database: str | None, path: Path, store: str, **sqlite_options: bool | float) -> ThreadLocalDb | PostgresDb:
    """The PostgreSQL database at URL `database`, else the SQLite file `path` (`sqlite_options`: ThreadLocalDb's).

    Raises:
        BadDatabaseUrl, DatabaseUnavailable (PostgreSQL only).
    """
    if database is not None:
        return PostgresDb(check_postgres_url(database), store)
    return ThreadLocalDb(path, **sqlite_options)


Db = ThreadLocalDb | PostgresDb  # a store's database, either backend
