"""Stage 4, serving: start an engine, tell warming from hung from crashed, keep it watched, end it.

``launcher`` builds and starts the engine command in its own process group, ``readiness`` is the
gate, ``liveness`` the progress signals (log growth, CPU, GPU), ``watchdog`` guards a running
engine, ``diagnostics`` collects stack dumps and logs, ``procs`` owns process groups, ``preflight``
checks a launch before any process starts, ``reference`` is the CPU reference engine (an
SGLang-compatible server around an in-process EAGLE-3 chain decoder).
"""
