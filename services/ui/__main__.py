"""``python -m services.ui --tokens FILE [--port P] [--reports DIR] [--namespace NS]``: the options of
`robotloop ui`."""

from services.options import main
from services.ui import UiOptions

if __name__ == "__main__":
    main(UiOptions, "services.ui.app", "python -m services.ui")
