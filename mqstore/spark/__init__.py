"""The Spark data source `commitlog` (batch and streaming) over a store's files.

    from mqstore.spark import CommitLogDataSource
    spark.dataSource.register(CommitLogDataSource)
"""

from mqstore.spark.source import *  # noqa: F401,F403  (the source's __all__)
from mqstore.spark.source import __all__  # noqa: F401
