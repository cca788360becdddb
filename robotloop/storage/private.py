"""Directories that hold bucket data, caches, jobs and releases: this user's only.

A bucket's privacy is enforced by tokens at the server; the files under the server's root, a read cache or a
robot's release store hold the same bytes. With the usual umask (022) they would be readable by every user of
the machine, so each data root is made 0700.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)


def private_dir(path: str | os.PathLike) -> Path:
    """Create `path` (and its parents), make `path` itself accessible to this user only (mode 0700), and return it
    absolute: a data root must name the same folder after a `chdir`, and paths made under it (`tempfile.mkdtemp`
    returns absolute ones) compare equal to it.

    Parents keep their modes: only the leaf holds our data. A directory owned by another user is left as it
    is, with a warning (only its owner could change it).

    Example:
        ```python
        >>> private_dir(Path("~/.cache/robotloop/read-cache").expanduser())
        ```
    """
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        try:
            path.chmod(0o700)
        except PermissionError:
            log.warning("%s is readable by other users and owned by another; its data is not private", path)
    return path
