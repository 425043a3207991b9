"""The Spark data source `commitlog` (batch and streaming) over a store's files.

    import mqstore.spark
    mqstore.spark.register(spark)        # or spark.dataSource.register(mqstore.spark.CommitLogDataSource)
    spark.read.format("commitlog").load("my-store")
"""

from mqstore.spark.source import PYSPARK_PYTHON_DEFAULT as PYSPARK_PYTHON_DEFAULT
from mqstore.spark.source import CommitLogDataSource, CommitLogSourceError, commitlog_schema, register

__all__ = ["CommitLogDataSource", "CommitLogSourceError", "commitlog_schema", "register"]
