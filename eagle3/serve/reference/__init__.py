"""The CPU reference engine: an SGLang-compatible HTTP server doing real EAGLE-3 speculative decoding.

Run as ``python -m eagle3.serve.reference --model-path T --speculative-algorithm EAGLE3
--speculative-draft-model-path D --speculative-num-steps 3 --speculative-eagle-topk 1
--speculative-num-draft-tokens 4 --host 127.0.0.1 --port P``. Flags it does not implement are refused by name
(exit code 2). Endpoints, fields and log lines follow SGLang 0.5.23 (``sglang/srt/entrypoints/http_server.py``,
``managers/tokenizer_manager.py``); decoding is :class:`eagle3.serve.reference.specdec.SpeculativeDecoder`.

Flag parsing: ``eagle3.serve.reference.__main__.parse_args``; the app: ``eagle3.serve.reference.server``.
(Nothing is imported here, so ``python -m`` does not import ``__main__`` twice.)
"""
