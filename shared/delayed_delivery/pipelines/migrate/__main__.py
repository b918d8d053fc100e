"""``python -m delayed_delivery.pipelines.migrate preview|run|abort …``: the ``migrate`` commands."""

import sys

from delayed_delivery.pipelines.cli import main

if __name__ == "__main__":
    main(["migrate", *sys.argv[1:]])
