"""What the CAS store raises: one class per thing that can be wrong with a request or with the stored bytes, each
under the library's error kinds (`robotloop.errors`) so that services map them to statuses in one place."""

from __future__ import annotations

from robotloop import errors
from robotloop.errors import BadInput, NotFound, RobotloopError, Unavailable


class CasError(RobotloopError):
    """Base of all store errors; the message names the object and what is wrong."""


class BadHash(BadInput, CasError):
    """A hash argument is not 64 lowercase hex digits."""


class CorruptXorb(BadInput, CasError):
    """Xorb bytes are malformed or do not hash to the claimed hash."""


class CorruptShard(BadInput, CasError):
    """Shard bytes are malformed or disagree with the stored xorbs."""


class TruncatedShard(CorruptShard):
    """Shard bytes end inside a section."""


class UnknownXorb(NotFound, CasError):
    """A xorb that is not stored was referenced or requested."""


class DamagedXorb(Unavailable, CasError):
    """A stored xorb's bytes no longer match the chunk hashes it was verified with at upload (a flipped bit on disk,
    a truncated or edited file). Its bytes are never served; uploading the xorb again repairs it."""


class UnknownFile(NotFound, CasError):
    """No shard has registered this file hash."""


class RangeNotSatisfiable(BadInput, CasError):
    """Requested byte range starts at or beyond the end of the object."""


class TooLarge(errors.TooLarge, CasError):
    """Body exceeds the configured size limit."""
