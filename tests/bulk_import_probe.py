"""Records whether CPython's cyclic collector was on when this module was imported. A training function that
refers to it makes a worker import it as it unpickles the function (bulk_imports.py pauses the collector there)."""

import gc

COLLECTOR_ON_AT_IMPORT = gc.isenabled()
