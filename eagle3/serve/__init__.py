"""Stage 4, serving: start an engine, tell warming from hung from crashed, keep it watched, end it.

``launcher`` starts the engine in its own process group, ``readiness`` is the gate, ``liveness``
the progress signals (log growth, CPU, GPU), ``watchdog`` guards a running engine, ``diagnostics``
collects stack dumps and logs, ``preflight`` checks a launch before any process starts.
"""
