"""Building the SparkSession: ``local[*]`` by default, the cluster's master under spark-submit."""

from __future__ import annotations

import os
import sys
from typing import Any

from ..errors import ConfigurationError

__all__ = ["LOCAL_CONF", "get_session"]

#: Settings for a quiet local session on loopback (also used by the test fixture).
LOCAL_CONF: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.python.worker.reuse": "true",
}


def get_session(master: str | None = None, app_name: str = "delayed-delivery") -> Any:
    """The active SparkSession, or a new one (``master`` or, outside spark-submit, ``local[*]``)."""
    try:
        from pyspark import SparkConf
        from pyspark.sql import SparkSession
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError(
            "the Spark pipelines need PySpark and Java 17: pip install 'delayed-delivery[spark]'"
        ) from exc
    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    conf = SparkConf()
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif not conf.contains("spark.master"):
        builder = builder.master("local[*]")
    is_local = (master or conf.get("spark.master", "local[*]") or "").startswith("local")
    if is_local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        for key, value in LOCAL_CONF.items():
            if not conf.contains(key):
                builder = builder.config(key, value)
    else:
        builder = builder.config("spark.sql.session.timeZone", "UTC")
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
