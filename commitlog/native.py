"""Which codec runs the per-message byte work: the compiled core (`mqstore.commitlog._native`) or the pure-Python one.

`NATIVE` is the extension module, or None when the pure-Python reference codec is selected: by the environment
variable MQSTORE_NATIVE=0, or because the extension was not built. `MQSTORE_NATIVE=1` makes a missing extension
an ImportError instead of a silent fallback.
"""

from __future__ import annotations

import os

_CHOICE = os.environ.get("MQSTORE_NATIVE", "")

if _CHOICE == "0":
    NATIVE = None
else:
    try:
        from mqstore.commitlog import _native as NATIVE
    except ImportError:
        if _CHOICE == "1":
            raise
        NATIVE = None
