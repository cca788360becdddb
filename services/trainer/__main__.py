"""``python -m services.trainer --tokens FILE [--root DIR] [--host H] [--port P]``: the options of
`robotloop trainer serve`."""

from services.options import main
from services.trainer import TrainerOptions

if __name__ == "__main__":
    main(TrainerOptions, "services.trainer.app", "python -m services.trainer")
