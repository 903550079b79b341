"""The serving engine's pinned facts (``sglang/``): the declarative loader profile and its types,
the serving settings it really runs, and its draft forward, interpreter and source.
``eagle3.engines.registry.get_profile(engine, version)`` is the entry point."""
