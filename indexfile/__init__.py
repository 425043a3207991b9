"""IndexFile: find messages by key within a time range (RocketMQ's IndexFile and IndexService).

`format` holds the byte layout and the key hash, `index_file` one mapped file, `index_service` the files of
a store as one index, `dispatcher` the Dispatcher that builds it from the CommitLog.
"""

from mqstore.indexfile.dispatcher import IndexDispatcher
from mqstore.indexfile.index_file import IndexFile
from mqstore.indexfile.index_service import IndexService

__all__ = ["IndexDispatcher", "IndexFile", "IndexService"]
