"""`hf://buckets/<namespace>/<bucket>/<path>` URLs.

Parsing is huggingface_hub's own (`parse_hf_uri`), so robotloop accepts exactly what `hf` and HfFileSystem
accept; this module only adds the bucket-only check and the path rules the bucket server enforces too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from huggingface_hub.errors import HfUriError, HFValidationError
from huggingface_hub.utils import parse_hf_uri, validate_repo_id

from ..errors import BadInput


class BadBucketUrl(BadInput, ValueError):
    """A string is not a usable `hf://buckets/...` URL."""


@dataclass(frozen=True)
class BucketUrl:
    """A location in a bucket.

    Example:
        ```python
        >>> url = BucketUrl.parse("hf://buckets/lab/demos/datasets/cube")
        >>> url.bucket_id, url.path
        ('lab/demos', 'datasets/cube')
        >>> str(url / "meta" / "info.json")
        'hf://buckets/lab/demos/datasets/cube/meta/info.json'
        ```
    """

    bucket_id: str
    path: str = ""

    @classmethod
    def parse(cls, url: str) -> BucketUrl:
        """Parse a URL.

        Raises:
            BadBucketUrl: not an `hf://buckets/<ns>/<bucket>[/<path>]` URL, a namespace or bucket name the Hub
                refuses (spaces, `--`, ...), or the path climbs out (`..`).
        """
        try:
            parsed = parse_hf_uri(url)
        except HfUriError as error:
            # Its specific reasons are kept ("Bucket id must be 'namespace/name'"); its description of every Hub
            # URL kind is not: only bucket URLs are ours.
            reason = str(error).split(" Must start with")[0].split(" Expected format")[0].rstrip(".")
            raise BadBucketUrl(f"{reason}. Expected hf://buckets/<namespace>/<bucket>/<path>") from None
        if parsed.type != "bucket":
            raise BadBucketUrl(
                f"'{url}' is a {parsed.type} URL; robotloop stores data in buckets: hf://buckets/<ns>/<bucket>/..."
            )
        try:
            validate_repo_id(parsed.id)  # the Hub's rule for names, which servers enforce too: refused here, not there
        except HFValidationError as error:
            raise BadBucketUrl(f"'{url}': {error}") from None
        return cls(parsed.id, _clean_path(parsed.path_in_repo, url))

    @property
    def namespace(self) -> str:
        return self.bucket_id.split("/", 1)[0]

    @property
    def bucket(self) -> str:
        return self.bucket_id.split("/", 1)[1]

    def __truediv__(self, part: str) -> BucketUrl:
        return BucketUrl(self.bucket_id, _clean_path(f"{self.path}/{part}", str(self)))

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    def __str__(self) -> str:
        return f"hf://buckets/{self.bucket_id}/{self.path}".rstrip("/")


def _clean_path(path: str, url: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BadBucketUrl(f"'{url}': '..' is not allowed in a bucket path.")
    return "/".join(parts)
