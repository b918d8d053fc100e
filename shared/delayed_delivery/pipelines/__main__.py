"""``python -m delayed_delivery.pipelines`` and ``spark-submit …/delayed_delivery/pipelines/__main__.py``.

The commands are ``migrate preview|run|abort`` and ``report`` (``--help`` lists their options).
"""

from delayed_delivery.pipelines.cli import main

if __name__ == "__main__":
    main()
