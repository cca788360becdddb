"""Authentication and authorization for robotloop's services: the bucket server (Hub and Xet CAS routes) and the
capture, training, deploy and dashboard services, which all take the same tokens file.

Two kinds of credentials exist:

* **Hub tokens** (long-lived, from a tokens file) are what `huggingface_hub` sends as
  ``Authorization: Bearer <token>`` to the Hub API routes. A tokens file has one token per
  line::

      # token               access  namespace
      hf_robot_writer       write   robots
      hf_dashboard_reader   read    *

  ``access`` is ``read`` or ``write``; ``namespace`` is the only namespace the token may
  touch, or ``*`` for every namespace. ``#`` starts a comment; blank lines are ignored.

* **CAS access tokens** (short-lived, minted by the ``xet-read-token`` / ``xet-write-token``
  routes) are what ``hf_xet`` sends to the CAS routes. They are HMAC-SHA256 signed claims
  ``{ns, bucket, write, exp}``; nothing is stored server side, so verifying one is a pure
  function of the token and the server secret.

Rules enforced by :meth:`TokenStore.authorize`:

* Buckets are private by default. Anonymous callers may only *read* buckets marked public.
* No token (on a write or a private read) or an unknown token -> :class:`Unauthorized`.
* A valid token used outside its namespace, or a read token used for a write
  -> :class:`Forbidden`. Public buckets stay readable by any valid token.

**Open local mode** (no tokens file, the embedded default on localhost): every request is
allowed, with or without a token, and ``me`` means namespace :data:`DEFAULT_NAMESPACE`.
It exists so that a single-user setup needs zero configuration; it must never be exposed
beyond loopback (``services.bucket.app.serve`` refuses a non-loopback host in that mode).
CAS tokens are still minted and checked in open mode, so the CAS routes behave identically.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import BadInput, Refused

DEFAULT_NAMESPACE = "local"
"""Namespace that ``me`` resolves to in open local mode and for ``*`` tokens (which have no home)."""

WILDCARD = "*"
CAS_TOKEN_TTL_S = 3600
_CAS_SECRET_FILE = "cas_token_secret"


class AuthError(Refused):
    """Base class for authentication/authorization failures."""


class Unauthorized(AuthError):
    """No credentials or unknown credentials: the caller may retry with a token."""


class Forbidden(AuthError):
    """Valid credentials that do not grant the requested access."""


class TokensFileError(BadInput, ValueError):
    """The tokens file is malformed; the message names the file and the line number."""


@dataclass(frozen=True)
class TokenEntry:
    """One line of the tokens file."""

    token: str
    write: bool
    namespace: str  # a namespace or WILDCARD


@dataclass(frozen=True)
class Principal:
    """Who is calling, as decided by :meth:`TokenStore.authorize`.

    ``name`` is the namespace ``me`` refers to: the token's namespace, or
    :data:`DEFAULT_NAMESPACE` for a ``*`` token and in open mode; ``None`` when anonymous.
    """

    name: str | None
    namespace: str | None  # the token's namespace scope: a namespace, WILDCARD, or None (anonymous)
    write: bool
    anonymous: bool
    open_mode: bool = False

    def can_access(self, namespace: str, write: bool) -> bool:
        """Whether this principal's scope covers ``namespace`` with the requested access."""
        if self.open_mode:
            return True
        if self.anonymous or (write and not self.write):
            return False
        return self.namespace in (WILDCARD, namespace)


@dataclass(frozen=True)
class CasClaims:
    """Claims carried by a CAS access token."""

    namespace: str
    bucket: str
    write: bool
    exp: int


def parse_tokens_text(text: str, source: str = "<tokens>") -> dict[str, TokenEntry]:
    """Parse tokens-file text into ``{token: TokenEntry}``.

    Example::

        >>> parse_tokens_text("t1 write robots\\n# c\\n\\nt2 read *")["t2"].namespace
        '*'

    Raises:
        TokensFileError: on a line without exactly 3 fields, an access other than
            read/write, an invalid namespace, or a duplicated token (message names the line).
    """
    entries: dict[str, TokenEntry] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        where = f"{source}:{lineno}"
        if len(fields) != 3:
            raise TokensFileError(f"{where}: expected '<token> <read|write> <namespace|*>', got {len(fields)} field(s)")
        token, access, namespace = fields
        if access not in ("read", "write"):
            raise TokensFileError(f"{where}: access must be 'read' or 'write', got {access!r}")
        if namespace != WILDCARD and not _valid_namespace(namespace):
            raise TokensFileError(f"{where}: invalid namespace {namespace!r}")
        if token in entries:
            raise TokensFileError(f"{where}: duplicated token")
        entries[token] = TokenEntry(token=token, write=access == "write", namespace=namespace)
    return entries


def new_token(prefix: str = "rl_") -> str:
    """A fresh random token (192 bits, URL-safe), e.g. ``rl_ops_...`` for a deploy operator."""
    return prefix + secrets.token_urlsafe(24)


def add_token(path: Path, write: bool, namespace: str = WILDCARD, prefix: str = "rl_") -> str:
    """Append a line with a fresh token (`new_token`) to the tokens file at `path`, made (mode 0600) if there is
    none; returns the token. A service reads its tokens file when it starts: restart one that runs.

    Raises:
        TokensFileError: the file there is no tokens file (a malformed line: nothing is appended), or it cannot be
            read or written.
    """
    path = Path(path)
    token = new_token(prefix)
    try:
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        parse_tokens_text(text, source=str(path))
        line = f"{token} {'write' if write else 'read'} {namespace}\n"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(line if not text or text.endswith("\n") else "\n" + line)
    except (OSError, UnicodeDecodeError) as error:
        raise TokensFileError(
            f"{path}: cannot add a token there: {getattr(error, 'strerror', None) or error}"
        ) from None
    return token


def token_proof(token: str, nonce: bytes) -> str:
    """See `TokenStore.prove`."""
    return hmac.new(hashlib.sha256(token.encode()).digest(), nonce, hashlib.sha256).hexdigest()


def _valid_namespace(namespace: str) -> bool:
    # Same character rule as bucket names (see buckets.validate_name), kept local to avoid a cycle.
    return 0 < len(namespace) <= 96 and namespace.replace("-", "").replace("_", "").replace(".", "").isalnum()


class TokenStore:
    """Hub-token checks plus minting/verification of short-lived CAS tokens.

    ``entries=None`` means open local mode (see module docstring).
    """

    def __init__(self, entries: dict[str, TokenEntry] | None, cas_secret: bytes | None = None) -> None:
        self._entries = entries
        # A random secret invalidates CAS tokens on restart; clients simply refresh them.
        self._secret = cas_secret if cas_secret is not None else secrets.token_bytes(32)

    def prove(self, nonce: bytes) -> list[str]:
        """Proofs that this server holds its `* write` tokens, without sending any: HMAC-SHA256 of `nonce` keyed by
        each token's SHA-256 (at most 16). A local client checks for its own before it sends its token, so a
        process squatting a dead server's port learns nothing (`robotloop.storage.embedded`)."""
        owned = [t for t, e in (self._entries or {}).items() if e.write and e.namespace == WILDCARD][:16]
        return [token_proof(t, nonce) for t in owned]

    @classmethod
    def from_file(cls, path: Path | str | None, cas_secret: bytes | None = None) -> TokenStore:
        """Load a tokens file; ``path=None`` gives open local mode.

        Raises:
            TokensFileError: no such file, a malformed line (its number in the message), or no token at all
                (a server that refuses every request is a mistake, not a mode).
        """
        if path is None:
            return cls(None, cas_secret)
        path = Path(path)
        line = "'<token> <read|write> <namespace|*>' per line"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise TokensFileError(f"{path}: no such tokens file (it holds {line})") from None
        entries = parse_tokens_text(text, source=str(path))
        if not entries:
            raise TokensFileError(
                f"{path}: no token in this tokens file, so every request would be refused; add {line}"
            )
        return cls(entries, cas_secret)

    @property
    def open_mode(self) -> bool:
        """True when no tokens file was given: everything is allowed."""
        return self._entries is None

    def principal(self, bearer: str | None) -> Principal:
        """Identify the caller without checking any permission.

        Raises:
            Unauthorized: ``bearer`` is given but unknown (not in open mode).
        """
        if self._entries is None:
            return Principal(name=DEFAULT_NAMESPACE, namespace=WILDCARD, write=True, anonymous=False, open_mode=True)
        if not bearer:
            return Principal(name=None, namespace=None, write=False, anonymous=True)
        entry = self._entries.get(bearer)
        if entry is None:
            # This exact message makes huggingface_hub report a bad token instead of "repo not found".
            raise Unauthorized("Invalid credentials in Authorization header")
        name = DEFAULT_NAMESPACE if entry.namespace == WILDCARD else entry.namespace
        return Principal(name=name, namespace=entry.namespace, write=entry.write, anonymous=False)

    def require(self, authorization: str | None, write: bool, why: str, who: str = "a token") -> str:
        """The bearer token of an ``Authorization`` header, known and (if ``write``) allowed to write; the
        services' gate. ``why`` ends the read-only message, e.g. "recording needs a 'write' token".

        Raises:
            Unauthorized: no token, or an unknown one. Forbidden: ``write`` and a read-only token.
        """
        token = bearer_from_header(authorization)
        if not token:
            raise Unauthorized(f"{who} is required: send 'Authorization: Bearer <token>'")
        who = self.principal(token)  # an unknown token is refused on reads too
        if write and not who.write:
            raise Forbidden(f"this token is read-only; {why}")
        return token

    def authorize(self, bearer: str | None, namespace: str, write: bool, bucket_public: bool) -> Principal:
        """Check that ``bearer`` may read (or write) in ``namespace``.

        Example::

            >>> store = TokenStore({"t": TokenEntry("t", True, "robots")})
            >>> store.authorize("t", "robots", write=True, bucket_public=False).name
            'robots'

        Raises:
            Unauthorized: no token for a write or a private read, or an unknown token.
            Forbidden: token for another namespace, or a read-only token used for a write.
        """
        who = self.principal(bearer)
        if who.can_access(namespace, write):
            return who
        if not write and bucket_public:
            return who
        if who.anonymous:
            raise Unauthorized(
                "authentication required" + (" to write" if write else f" to read namespace '{namespace}'")
            )
        if write and not who.write:
            raise Forbidden(f"token is read-only; writing to namespace '{namespace}' needs a write token")
        raise Forbidden(f"token is scoped to namespace '{who.namespace}', not '{namespace}'")

    # --- CAS access tokens -------------------------------------------------------------

    def mint_cas_token(self, namespace: str, bucket: str, write: bool, ttl_s: int = CAS_TOKEN_TTL_S) -> tuple[str, int]:
        """Mint a signed CAS token; returns ``(token, exp_unix)``.

        The token is ``<b64url(json claims)>.<b64url(hmac-sha256)>``: header-safe, opaque to hf_xet.
        """
        exp = int(time.time()) + ttl_s
        claims = {"ns": namespace, "b": bucket, "w": bool(write), "exp": exp, "n": secrets.token_hex(4)}
        payload = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
        return f"{payload}.{_b64(self._sign(payload))}", exp

    def verify_cas_token(self, token: str | None, write: bool) -> CasClaims:
        """Check a CAS token's signature, expiry and (for ``write=True``) write permission.

        Raises:
            Unauthorized: missing, malformed, badly signed or expired token.
            Forbidden: a read token used for a write.
        """
        if not token:
            raise Unauthorized("missing CAS access token")
        payload, _, sig = token.partition(".")
        try:
            good = hmac.compare_digest(_unb64(sig), self._sign(payload))
            claims = json.loads(_unb64(payload)) if good else None
        except (ValueError, json.JSONDecodeError):
            raise Unauthorized("malformed CAS access token") from None
        if claims is None:
            raise Unauthorized("invalid CAS access token signature")
        if int(claims["exp"]) <= time.time():
            raise Unauthorized("CAS access token expired; fetch a new one from the xet token endpoint")
        if write and not claims["w"]:
            raise Forbidden(f"CAS access token for bucket '{claims['ns']}/{claims['b']}' is read-only")
        return CasClaims(namespace=claims["ns"], bucket=claims["b"], write=bool(claims["w"]), exp=int(claims["exp"]))

    def _sign(self, payload: str) -> bytes:
        return hmac.new(self._secret, payload.encode(), hashlib.sha256).digest()


def load_or_create_secret(root: Path) -> bytes:
    """Return the CAS-token secret stored under ``root`` (created, mode 0600, on first use).

    Persisting it lets CAS tokens survive a server restart.
    """
    path = Path(root) / _CAS_SECRET_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_bytes(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it meanwhile
        return path.read_bytes()
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
        f.flush()
        os.fsync(f.fileno())
    return secret


def bearer_from_header(authorization: str | None) -> str | None:
    """Extract the token from an ``Authorization: Bearer <token>`` header (None if absent)."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
