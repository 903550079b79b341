"""The CPU reference engine: an SGLang-compatible HTTP server doing real EAGLE-3 speculative
decoding.

Run as ``python -m refengine.launch_server --model-path T --speculative-algorithm EAGLE3
--speculative-draft-model-path D --speculative-num-steps 3 --speculative-eagle-topk 1
--speculative-num-draft-tokens 4 --host 127.0.0.1 --port P``. Flags it does not implement are
refused by name (exit code 2). Endpoints, fields and log lines follow SGLang's
(``sglang/srt/entrypoints/http_server.py``, ``managers/tokenizer_manager.py``). Flag parsing:
``refengine.launch_server``; the app: ``refengine.server``; decoding: ``refengine.fastpath`` (Llama
targets) or ``refengine.specdec``. ``__version__`` names the engine in the deploy cache key.
(Nothing is imported here, so ``python -m`` does not import ``__main__`` twice.)
"""

__version__ = "0.1.0"
