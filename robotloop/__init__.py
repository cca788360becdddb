"""robotloop: record into Xet buckets, stream-train LeRobot ACT, deploy signed weights."""

__version__ = "0.1.0"
