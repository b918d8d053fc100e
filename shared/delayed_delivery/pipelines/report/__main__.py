"""``python -m delayed_delivery.pipelines.report …``: the ``report`` command of the pipelines' command line."""

import sys

from delayed_delivery.pipelines.cli import main

if __name__ == "__main__":
    main(["report", *sys.argv[1:]])
