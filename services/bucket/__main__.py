"""``python -m services.bucket [--root DIR] [--host 127.0.0.1] [--port 8750] [--tokens FILE]``: the options of
`robotloop bucket serve`."""

from services.bucket import BucketOptions
from services.options import main

if __name__ == "__main__":
    main(BucketOptions, "services.bucket.app", "python -m services.bucket")
