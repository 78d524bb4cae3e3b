"""The process pool of ``executor="process"`` and its wire. ``worker``, ``wire`` and ``columns``
run in the worker processes too, so they import nothing of aioflow but each other."""
