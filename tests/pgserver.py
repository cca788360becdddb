"""A real PostgreSQL server for the tests: `initdb` and `pg_ctl` in a temporary folder, on a free port of 127.0.0.1,
with password authentication (so a wrong password is refused as in production).

PostgreSQL refuses to run as root; the suite often does (containers). Then the cluster belongs to `nobody` and the
binaries run through `runuser -u nobody --` (util-linux, on every Debian and Ubuntu), in a folder under the system's
temporary directory that `nobody` may enter (pytest's own are root's, mode 0700).

Without the binaries the tests fail with the command that installs them: a database-backed service untested is not
a pass.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from robotloop.service_process import free_port

USER, PASSWORD = "robotloop", "pg-test-secret"
INSTALL = "sudo apt-get install -y postgresql  (or: scripts/system-deps)"


def server_binaries() -> Path:
    """The folder of `initdb` and `pg_ctl`: Debian's /usr/lib/postgresql/<version>/bin (newest), else PATH's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    pytest.fail(f"PostgreSQL's server binaries (initdb, pg_ctl) are not installed: {INSTALL}")


@dataclass
class PgServer:
    """One PostgreSQL cluster: `url(dbname)` to reach it, `stop()` and `start()` to take it away and back."""

    bindir: Path
    data: Path
    port: int
    as_user: list[str]

    def url(self, dbname: str, password: str = PASSWORD) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{dbname}"

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c max_connections=300"
        log = str(self.data / "log")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", log, "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """`fast`: roll back open transactions and close connections, as a restart under load does."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def database(self, name: str) -> str:
        """The URL of database `name`, created if new."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def start_postgres(icu: bool = True) -> tuple[PgServer, Path]:
    """initdb + pg_ctl start; returns the server and the folder to remove after `stop()`. `icu=False` for a build
    without ICU (benchmarks/pack_cluster.sh's); the suite keeps ICU's collation (below)."""
    bindir = server_binaries()
    base = Path(tempfile.mkdtemp(prefix="robotloop-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(base, nobody.pw_uid, nobody.pw_gid)
        as_user = ["runuser", "-u", "nobody", "--"]
    pwfile = base / "pwfile"
    pwfile.write_text(PASSWORD + "\n")
    os.chmod(pwfile, 0o644)  # nobody reads it; it is a throwaway test password
    server = PgServer(bindir, base / "data", free_port(), as_user)
    # A linguistic default collation (ICU's en-US, PostgreSQL 15 and later), as production databases have: the stores
    # must not depend on the database's collation for their code-point range scans (they say COLLATE "C").
    version = subprocess.run([str(bindir / "initdb"), "--version"], capture_output=True, text=True).stdout
    major = int(version.split()[-1].split(".")[0])
    collation = ["--locale-provider=icu", "--icu-locale=en-US"] if icu and major >= 15 else []
    auth = ["-U", USER, "--auth=scram-sha-256", f"--pwfile={pwfile}"]
    locale = ["--encoding=UTF8", "--locale=C.UTF-8", *collation]
    server._run(str(bindir / "initdb"), "-D", str(server.data), *auth, *locale)
    server.start()
    return server, base
