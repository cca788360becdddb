"""``python -m services.deploy --tokens FILE [--db PATH] [--host H] [--port P]``: the options of
`robotloop deploy serve`."""

from services.deploy import DeployOptions
from services.options import main

if __name__ == "__main__":
    main(DeployOptions, "services.deploy.app", "python -m services.deploy")
