"""The sans-I/O core: the decisions of the checker, the sequencer and a partition, as pure state
machines. No sockets, threads, asyncio, backend calls or clock: every method that needs the
time takes ``now``. The core imports only itself and :mod:`idempotent.errors`
(``tests/test_imports.py`` checks it); the shells in the other packages carry out its decisions."""
