"""The Spark format "commitlog" (batch and streaming) over a store's files.

    from pyspark.sql import SparkSession
    import mqstore.spark

    spark = mqstore.spark.configure(SparkSession.builder).getOrCreate()   # the JVM reader's jar on spark.jars
    mqstore.spark.register(spark)        # the Python source instead, with a warning, when that jar is not loaded
    spark.read.format("commitlog").load("my-store")
"""

from mqstore.spark.source import PYSPARK_PYTHON_DEFAULT as PYSPARK_PYTHON_DEFAULT
from mqstore.spark.source import (
    CommitLogDataSource,
    CommitLogSourceError,
    PythonCommitLogDataSource,
    commitlog_schema,
    register,
)


def configure(builder):
    """Put the JVM reader's jar on a SparkSession builder's spark.jars and return the builder (before the session
    starts); when the jar cannot be built, warn and return the builder as it was. mqstore.spark.jvm.configure."""
    from mqstore.spark import jvm

    return jvm.configure(builder)


__all__ = ["CommitLogDataSource", "CommitLogSourceError", "PythonCommitLogDataSource", "commitlog_schema",
           "configure", "register"]
