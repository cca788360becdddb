"""What the streaming data path raises."""

from ...errors import BadInput, Unavailable


class DatasetMismatch(BadInput, ValueError):
    """Datasets given to one sampler do not share features (or frame rate); the message says which."""


class DataError(Unavailable, RuntimeError):
    """An episode could not be read or decoded after retries; the message names the episode and the cause."""
