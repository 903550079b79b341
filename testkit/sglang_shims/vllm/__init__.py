"""A stand-in for the single vLLM function SGLang 0.5.23 imports on a CPU-only machine (test harness
only).

This is not vLLM. Only ``vllm._custom_ops.rotary_embedding`` exists; every other ``vllm.*`` import
keeps raising ``ImportError``, which SGLang already treats as "vLLM is not installed". It is put on
``PYTHONPATH`` by ``testkit/sglang_harness.py`` for processes running in ``.venv-sglang`` (see
docs/SGLANG_ON_CPU.md).
"""
