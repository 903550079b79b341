"""Serving engines: one module per engine with its declarative loader profile (and launcher).

``eagle3.engines.profiles.get_profile(engine, version)`` is the entry point for what an engine version's
EAGLE-3 loader accepts; see ``sglang_profile`` (pinned to the released source) and ``vllm_profile``.
"""
