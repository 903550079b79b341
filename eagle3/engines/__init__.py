"""Serving engines' pinned facts, one folder per engine (``sglang/``, ``vllm/``): the declarative loader
profile, conventions (aux-id translation), and for SGLang its draft forward and interpreter.

``eagle3.engines.registry.get_profile(engine, version)`` is the entry point; ``profile`` holds the types.
"""
