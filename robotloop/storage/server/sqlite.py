"""One SQLite connection per thread, and a transaction as a `with` block: the plumbing under the bucket server's
stores (`BucketStore`, `CasStore`), which many request threads read and write at once.

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


class ThreadLocalDb:
    """Durable connections to one SQLite file (WAL, synchronous=FULL: a commit is on disk when it returns), one
    per thread, made on first use.

    `isolation_level=None`: transactions are ours (`tx`), so a batch is exactly one transaction and a writer can
    take the write lock up front (BEGIN IMMEDIATE) instead of failing to upgrade a read lock mid-transaction.
    `timeout_s` is how long a writer waits for another's lock; `foreign_keys` turns their checks on; `rows` makes
    rows `sqlite3.Row` (read by column name)."""

    def __init__(self, path: Path, timeout_s: float = 30.0, foreign_keys: bool = False, rows: bool = False) -> None:
        self.path, self.timeout_s, self.foreign_keys, self.rows = path, timeout_s, foreign_keys, rows
        self._local = threading.local()

    def conn(self) -> sqlite3.Connection:
        """This thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            if self.foreign_keys:
                conn.execute("PRAGMA foreign_keys=ON")
            if self.rows:
                conn.row_factory = sqlite3.Row
            self._local.conn = conn
        return conn

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


class Transaction:
    """`with` block = one SQLite transaction: COMMIT on success, ROLLBACK on any exception."""

    def __init__(self, conn: sqlite3.Connection, immediate: bool) -> None:
        self.conn, self.immediate = conn, immediate

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE" if self.immediate else "BEGIN")
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
