"""Recording episodes into buckets as LeRobot v3 datasets, one committed episode at a time."""

from .episode import BadEpisode, Episode
from .recorder import CommitReport, DatasetRecorder, DatasetSpec

__all__ = ["BadEpisode", "CommitReport", "DatasetRecorder", "DatasetSpec", "Episode"]
