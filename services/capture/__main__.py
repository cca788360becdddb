"""``python -m services.capture --tokens FILE [--host H] [--port P]``: the options of `robotloop capture serve`."""

from services.capture import CaptureOptions
from services.options import main

if __name__ == "__main__":
    main(CaptureOptions, "services.capture.app", "python -m services.capture")
