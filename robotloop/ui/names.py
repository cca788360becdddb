"""The names the dashboard passes on to a service, and the error for what it does not have."""

from __future__ import annotations

from urllib.parse import quote

from ..errors import NotFound


class UnknownItem(NotFound, KeyError):
    """No such report, evaluation or file among those the dashboard shows."""


def path_name(kind: str, name: str) -> str:
    """`name`, checked to be one URL path segment as the services name things (letters, digits, `._-~`): the
    service clients put names into their URLs as they are, so a `/`, `?` or control character would make another
    request, or none.

    Raises:
        UnknownItem: no service has anything by that name.
    """
    if not name or name in (".", "..") or quote(name, safe="") != name:
        raise UnknownItem(f"no {kind} {name!r}")
    return name
