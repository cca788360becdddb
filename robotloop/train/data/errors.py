"""What the streaming data path raises."""

from ...errors import BadInput, NotFound, Unavailable


class DatasetMismatch(BadInput, ValueError):
    """Datasets given to one sampler do not share features (or frame rate); the message says which."""


class DataError(Unavailable, RuntimeError):
    """An episode could not be read or decoded after retries; the message names the episode and the cause."""


class StaleState(NotFound, ValueError):
    """A saved sampler state names episodes the datasets no longer hold (a dataset was rewritten)."""


class NotBuffered(Unavailable, TimeoutError):
    """The buffer did not fill in the time allowed (`StreamingSampler.wait_ready`)."""


class NothingToTrain(BadInput, ValueError):
    """No frame of the datasets has a positive weight (e.g. fleet data with no success and no expert frame, and no
    demos): training would learn nothing, or the failures. The message says what the data holds."""
