"""ed25519 deploy keys: the publisher signs release manifests, robots trust only configured public keys.

Files:
    deploy.key   the private key, PKCS#8 PEM, mode 0600 (keep it where releases are published from)
    deploy.pub   one line ``ed25519 <base64 raw public key> <key id>``; copy it to every robot

The key id is the first 16 hex digits of the SHA-256 of the raw public key: manifests name the key that signed
them, so a robot can hold several trusted keys (e.g. during a key rotation).

Example:
    ```python
    >>> key_id = generate_keypair(Path("deploy.key"))      # writes deploy.key and deploy.pub
    >>> signer = load_private_key(Path("deploy.key"))
    >>> trusted = load_public_keys([Path("deploy.pub")])
    >>> verify(trusted, signer.key_id, signer.sign(b"data"), b"data")
    ```
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from ..errors import BadInput, Conflict, Refused


class DeployKeyError(BadInput, ValueError):
    """A key file is missing, malformed or not an ed25519 key; the message names the file."""


class BadSignature(Refused, RuntimeError):
    """A signature does not verify, or was made by a key the robot does not trust."""


class KeyExists(Conflict, FileExistsError):
    """A key file exists where a new key would be written (a lost key cannot be recovered: never overwritten)."""


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class Signer:
    """A loaded private deploy key."""

    private: Ed25519PrivateKey

    @property
    def key_id(self) -> str:
        return key_id(self.private.public_key())

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)


def generate_keypair(private_path: Path, overwrite: bool = False) -> str:
    """Write a new private key to `private_path` (0600) and its public key next to it (`.pub`). Returns the key id.

    Raises:
        KeyExists: the key file exists and `overwrite` is False (a lost key cannot be recovered).
    """
    private_path = Path(private_path)
    if private_path.exists() and not overwrite:
        raise KeyExists(f"{private_path} exists; refusing to overwrite a deploy key (a lost key is not recovered)")
    private_path.parent.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    private_path.unlink(missing_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public_path(private_path).write_text(public_line(key.public_key()) + "\n")
    return key_id(key.public_key())


def public_path(private_path: Path) -> Path:
    return Path(private_path).with_suffix(".pub")


def public_line(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"ed25519 {base64.b64encode(raw).decode()} {key_id(public)}"


def load_private_key(path: Path) -> Signer:
    """Load a private deploy key written by `generate_keypair`.

    Raises:
        DeployKeyError: no such file, or not a PEM ed25519 private key.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise DeployKeyError(
            f"{path}: no deploy key there; make one with `robotloop deploy keygen` or pass "
            "the one that signs your releases (--key)"
        ) from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise DeployKeyError(
            f"{path}: not a PEM private key ({error}); make one with `robotloop deploy keygen`"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise DeployKeyError(f"{path}: a {type(key).__name__}, not an ed25519 key")
    return Signer(key)


def parse_public_line(line: str, source: str = "<public key>") -> Ed25519PublicKey:
    """Parse ``ed25519 <base64> [key id]``.

    Raises:
        DeployKeyError: malformed line, or a key id that does not match the key (a hand-edited file).
    """
    fields = line.split()
    if len(fields) not in (2, 3) or fields[0] != "ed25519":
        raise DeployKeyError(f"{source}: expected 'ed25519 <base64 public key> [key id]'")
    try:
        raw = base64.b64decode(fields[1], validate=True)
        public = Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as error:
        raise DeployKeyError(f"{source}: bad ed25519 public key ({error})") from None
    if len(fields) == 3 and fields[2] != key_id(public):
        raise DeployKeyError(f"{source}: key id {fields[2]} does not match the key ({key_id(public)})")
    return public


def parse_public_keys(text: str, source: str = "<public keys>") -> dict[str, Ed25519PublicKey]:
    """The keys of a public key file's `text` (`ed25519 ...` lines, `#` comments allowed) by key id; none for an
    empty file. `source` names it in errors. For a robot given the file's text rather than its path (a Ray task on
    another node, where the driver's path does not exist).

    Example:
        ```python
        >>> trusted = parse_public_keys(Path("deploy.pub").read_text(), "deploy.pub")
        ```

    Raises:
        DeployKeyError: a line is malformed.
    """
    keys: dict[str, Ed25519PublicKey] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if line:
            public = parse_public_line(line, f"{source}:{n}")
            keys[key_id(public)] = public
    return keys


def load_public_keys(paths: list[Path]) -> dict[str, Ed25519PublicKey]:
    """Trusted public keys by key id, from files of `ed25519 ...` lines (`#` comments allowed).

    Raises:
        DeployKeyError: a file is missing, a line is malformed, or there is no key at all.
    """
    keys: dict[str, Ed25519PublicKey] = {}
    for path in paths:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise DeployKeyError(
                f"{path}: no public key file there; copy the .pub file made beside the deploy key "
                "(`robotloop deploy keygen`) to the robot"
            ) from None
        keys |= parse_public_keys(text, str(path))
    if not keys:
        where = f"in {', '.join(map(str, paths))}" if paths else "configured"
        raise DeployKeyError(
            f"no trusted public key {where}: a robot loads only releases signed by a key it trusts. "
            "Give the .pub file made beside the deploy key (--trusted-key, or robot.trusted_keys)"
        )
    return keys


def verify(
    trusted: dict[str, Ed25519PublicKey], signer_id: str, signature: bytes, data: bytes, who: str = "this robot"
) -> None:
    """Check that `signature` over `data` was made by the trusted key `signer_id`; `who` holds the trusted keys (a
    robot, the deploy service), for the message.

    Raises:
        BadSignature: unknown key id, or the signature does not verify.
    """
    public = trusted.get(signer_id)
    if public is None:
        raise BadSignature(
            f"signed by key {signer_id}, which {who} does not trust (it trusts {', '.join(sorted(trusted))}): give "
            f"{who} that key's .pub file (--trusted-key), or sign with a key it trusts"
        )
    try:
        public.verify(signature, data)
    except InvalidSignature:
        raise BadSignature(f"the signature by key {signer_id} does not verify: the manifest was altered") from None
