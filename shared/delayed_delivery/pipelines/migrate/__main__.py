"""``python -m delayed_delivery.pipelines.migrate preview|run|abort …``: the ``migrate`` commands."""

from delayed_delivery.pipelines.migrate import main

if __name__ == "__main__":
    main()
