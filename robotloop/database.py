"""The services' databases: SQLite (embedded, the default) or PostgreSQL (``--database postgresql://...``), behind
the one connection interface the stores already use, sqlite3's: ``execute(sql, params)`` with ``?`` placeholders,
``fetchone``/``fetchall``/``rowcount``, ``executemany``, ``executescript``, and transactions as the statements
``BEGIN``, ``BEGIN IMMEDIATE``, ``COMMIT``, ``ROLLBACK``.

So a store writes its SQL once, in the part of SQL both dialects agree on (``INSERT ... ON CONFLICT``, ``CAST``,
``LIKE``), and only its schema twice (types differ: ``DOUBLE PRECISION`` not ``REAL``, identity columns, ``COLLATE
"C"`` so that text orders by code point as in SQLite, which the listings' range scans rely on).

On PostgreSQL (`PgConnection`):

* Each store keeps its tables in its own schema (``deploy``, ``buckets``, ``cas``: the connection's search_path), so
  one database can hold every service's state, as SQLite's separate files do.
* ``BEGIN IMMEDIATE`` is SQLite's "take the write lock up front": a transaction-scoped advisory lock, one per store
  (`lock_key`), so the checks a writer makes inside its transaction cannot race another replica's writer, exactly
  as they cannot race another thread's on SQLite. Readers never wait for it (READ COMMITTED).
* A connection the server dropped (a restart, a crash) is made again at the next statement that starts something
  (a ``BEGIN``, or a statement outside a transaction), once; a statement inside a transaction that loses its
  connection raises `DatabaseUnavailable` (the server rolled the transaction back). The services answer that 503.
* A unique key taken raises `RowConflict` (sqlite3.IntegrityError stays sqlite3's: catch `ROW_CONFLICTS`).
* Bounded waits: for the writer lock (LOCK_TIMEOUT_S, then `DatabaseUnavailable`), for a replica frozen inside a
  transaction (IDLE_IN_TRANSACTION_S: the server rolls it back), for a server host that vanished
  (TCP_USER_TIMEOUT_S). What the URL sets itself (``?options=...``, ``?tcp_user_timeout=...``) wins, but for the
  search_path.

Example:
    ```python
    >>> conn = connect_postgres("postgresql://robotloop@127.0.0.1:5432/robotloop", store="deploy")
    >>> conn.execute("BEGIN IMMEDIATE")              # BEGIN; SELECT pg_advisory_xact_lock(...)
    >>> conn.execute("UPDATE robots SET channel = ? WHERE id = ?", ("canary", "r1")).rowcount
    1
    >>> conn.execute("COMMIT")
    ```
"""

from __future__ import annotations

import functools
import hashlib
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .errors import BadValue, Conflict, Unavailable

POSTGRES_SCHEMES = ("postgresql", "postgres")
CONNECT_TIMEOUT_S = 5  # a server that does not answer at start, or while it restarts, is a 503 after this long
LOCK_TIMEOUT_S = 30  # a writer waits this long for another replica's writer (`BEGIN IMMEDIATE`), then 503
# A replica frozen mid-transaction (SIGSTOP, a hung host) would hold its store's writer lock for good: the server ends
# its session after this long idle in a transaction, which rolls it back and frees the lock.
IDLE_IN_TRANSACTION_S = 60
# A server host that vanished without closing its connections (power, network) is given up on after this long,
# instead of the system's TCP retries (~15 min).
TCP_USER_TIMEOUT_S = 30


class DatabaseUnavailable(Unavailable):
    """The database server cannot be reached, refused the credentials, or dropped the connection mid-request: the
    transaction was rolled back (or, cut during its COMMIT, may have been applied: the message says so); the request
    may be sent again once the server is back."""


class BadDatabaseUrl(BadValue):
    """A ``--database`` that is not a ``postgresql://`` URL."""


class RowConflict(Conflict):
    """A statement would take a unique key that is taken (PostgreSQL's unique violation)."""


ROW_CONFLICTS = (RowConflict, sqlite3.IntegrityError)  # a unique key taken, on either backend


def is_postgres_url(database: object) -> bool:
    """Whether `database` (a path or a URL) names a PostgreSQL server.

    >>> is_postgres_url("postgresql://u@db/deploy"), is_postgres_url("/var/lib/deploy.sqlite")
    (True, False)
    """
    return isinstance(database, str) and database.split("://", 1)[0] in POSTGRES_SCHEMES and "://" in database


def check_postgres_url(url: str) -> str:
    """`url` if it is a ``postgresql://`` URL with a host or socket and a database name.

    Raises:
        BadDatabaseUrl: another scheme, or no database named.
    """
    parts = urlsplit(url)
    if parts.scheme not in POSTGRES_SCHEMES or not parts.path.strip("/"):
        raise BadDatabaseUrl(
            f"--database {redact(url)!r} is not a PostgreSQL URL: use postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME"
        )
    return url


def redact(url: str) -> str:
    """`url` with its password replaced by ``***`` (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def lock_key(store: str) -> int:
    """The advisory-lock key of `store`'s writers: a stable signed 64-bit number from its name."""
    return int.from_bytes(hashlib.sha256(store.encode()).digest()[:8], "big", signed=True)


def one_line(error: BaseException) -> str:
    """The driver's message on one line (psycopg's span several: the cause, then a hint)."""
    return " ".join(str(error).split())


class Row:
    """A PostgreSQL row read as sqlite3.Row reads: by index, by column name, unpacked as a tuple, ``dict(row)``."""

    __slots__ = ("_names", "_values")

    def __init__(self, names: dict[str, int], values: Sequence[Any]) -> None:
        self._names, self._values = names, values

    def __getitem__(self, key: int | str | slice) -> Any:
        return self._values[self._names[key] if isinstance(key, str) else key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[str]:
        return list(self._names)

    def __repr__(self) -> str:
        return f"Row({dict(zip(self._names, self._values, strict=True))!r})"


def _row_factory(cursor: Any) -> Any:
    names = {d.name: i for i, d in enumerate(cursor.description or ())}
    return lambda values: Row(names, values)


@functools.lru_cache(maxsize=1024)
def _to_pg(sql: str) -> str:
    # sqlite3's "?" placeholders become psycopg's "%s"; a literal "%" must then be doubled. The stores' SQL has no
    # "?" inside string literals (values travel as parameters), which makes this plain replacement sound.
    return sql.replace("%", "%%").replace("?", "%s")


_STORE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_BEGIN = re.compile(r"^\s*BEGIN(\s+IMMEDIATE)?\s*;?\s*$", re.IGNORECASE)
_END = re.compile(r"^\s*(COMMIT|ROLLBACK)\s*;?\s*$", re.IGNORECASE)


class PgConnection:
    """One PostgreSQL connection that reads like a sqlite3 connection in autocommit mode (``isolation_level=None``:
    transactions are the caller's BEGIN ... COMMIT), made again after the server dropped it (see the module's
    docstring). Not shared between threads without a lock, like a sqlite3 connection.

    Raises (from any statement): DatabaseUnavailable, RowConflict.
    """

    def __init__(self, url: str, store: str, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        if not _STORE.match(store):
            raise BadValue(f"store name {store!r}: a schema name of lowercase letters, digits and '_'")
        self.url, self.store, self.connect_timeout_s = check_postgres_url(url), store, connect_timeout_s
        self.lock_key = lock_key(store)
        self._conn: Any = None
        self._in_tx = False
        self._connect()

    def _connect(self) -> None:
        import psycopg  # only with --database postgresql://: the `full` extra brings it

        if self._conn is not None:
            self._conn.close()
        self._conn, self._in_tx = None, False
        try:
            self._conn = psycopg.connect(autocommit=True, row_factory=_row_factory, **self._conninfo())
        except psycopg.Error as error:
            raise DatabaseUnavailable(f"cannot connect to {redact(self.url)}: {one_line(error)}") from None

    def _conninfo(self) -> dict[str, Any]:
        """The URL's parameters over this module's defaults; the store's schema and the timeouts added to the
        server options the URL may set."""
        from psycopg.conninfo import conninfo_to_dict

        given = conninfo_to_dict(self.url)
        timeouts = f"-c lock_timeout={LOCK_TIMEOUT_S}s -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_S}s"
        # Later settings win: the URL's own over the timeouts, the store's schema over everything.
        options = f"{timeouts} {given.get('options', '')} -c search_path={self.store}"
        return {
            "connect_timeout": max(1, int(self.connect_timeout_s)),
            "tcp_user_timeout": TCP_USER_TIMEOUT_S * 1000,
            **given,
            "options": " ".join(options.split()),
        }

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement; returns a cursor (fetchone, fetchall, rowcount)."""
        begin, end = _BEGIN.match(sql), _END.match(sql)
        if end:
            return self._end(end.group(1).upper())
        if begin and self._in_tx:  # as sqlite3 refuses it: an inner COMMIT would end the outer transaction early
            raise RuntimeError("cannot start a transaction within a transaction")
        if self._in_tx:
            return self._run(sql, params)
        # Nothing of the caller's is open: a connection the server dropped since is made again, once.
        try:
            return self._start(sql, params, begin)
        except DatabaseUnavailable:
            if self._conn is not None and not self._conn.broken and not self._conn.closed:
                raise
            self._connect()
            return self._start(sql, params, begin)

    def _start(self, sql: str, params: Sequence[Any], begin: re.Match[str] | None) -> Any:
        if begin is None:
            return self._run(sql, params)
        cursor = self._run("BEGIN")
        self._in_tx = True
        if begin.group(1):  # IMMEDIATE: writers of this store go one at a time, whichever replica they are on
            self._run("SELECT pg_advisory_xact_lock(%s)", (self.lock_key,), raw=True)
        return cursor

    def _end(self, verb: str) -> Any:
        was_in_tx, self._in_tx = self._in_tx, False
        if verb == "ROLLBACK" and (self._conn is None or self._conn.broken or not was_in_tx):
            return None  # the server rolled it back when the connection dropped; nothing to say
        try:
            return self._run(verb)
        except DatabaseUnavailable as error:
            if verb != "COMMIT":
                raise
            raise DatabaseUnavailable(
                f"{str(error).removesuffix('; nothing was applied')}; cut during COMMIT: it may have been applied"
            ) from None

    def _run(self, sql: str, params: Sequence[Any] = (), raw: bool = False, many: list | None = None) -> Any:
        import psycopg

        if self._conn is None or self._conn.closed:
            raise DatabaseUnavailable(f"no connection to {redact(self.url)}")
        try:
            if many is not None:  # psycopg pipelines the rows: one round trip, not one per row
                cursor = self._conn.cursor()
                cursor.executemany(_to_pg(sql), many)
                return cursor
            # Without parameters psycopg sends the text as it is: no placeholders to translate, no "%" to double.
            query = sql if raw or not params else _to_pg(sql)
            return self._conn.execute(query, tuple(params) if params else None)
        except psycopg.errors.UniqueViolation as error:
            raise RowConflict(one_line(error)) from None
        except psycopg.errors.LockNotAvailable:
            raise DatabaseUnavailable(
                f"another replica held the {self.store} store's writer lock for over {LOCK_TIMEOUT_S} s; nothing was "
                "applied"
            ) from None
        except psycopg.Error as error:  # a dropped connection shows as several classes (the server's reason)
            if self._conn.broken or self._conn.closed:
                self._in_tx = False
                raise DatabaseUnavailable(
                    f"lost the connection to {redact(self.url)}: {one_line(error)}; nothing was applied"
                ) from None
            raise

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """One statement over many rows, inside the caller's transaction (or as one of its own)."""
        rows = [tuple(r) for r in rows]
        if not rows:
            return
        if self._in_tx:
            self._run(sql, many=rows)
            return
        self.execute("BEGIN")
        try:
            self._run(sql, many=rows)
            self.execute("COMMIT")
        except BaseException:
            self.execute("ROLLBACK")
            raise

    def executescript(self, script: str) -> None:
        """Run a schema (statements without parameters) as one transaction under the store's lock: replicas
        starting together would otherwise race on CREATE TABLE IF NOT EXISTS."""
        self.execute("BEGIN IMMEDIATE")
        try:
            self._run(script, raw=True)
            self.execute("COMMIT")
        except BaseException:
            self.execute("ROLLBACK")
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def connect_postgres(url: str, store: str) -> PgConnection:
    """A connection to the PostgreSQL at `url` for `store` (``deploy``, ``buckets``, ``cas``): its schema and its
    writer lock.

    Raises:
        BadDatabaseUrl: not a postgresql:// URL. DatabaseUnavailable: no server there, or credentials refused.
    """
    return PgConnection(url, store)
