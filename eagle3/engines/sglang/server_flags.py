"""The command-line flags of ``python -m sglang.launch_server`` in the pinned SGLang release
(:data:`eagle3.engines.sglang.profile.VERSION`), read from its source: every input field of
``server_args._INPUT_NAMESPACES`` (``arg_groups/fields/*.py``) that
``arg_utils.add_cli_args_from_dataclass`` registers, and the flags ``ServerArgs.add_cli_args`` adds
by hand, with how many values each takes (:func:`nargs`). ``tests/unit/test_sglang_flags.py``
(0.5.23) and ``tests/unit/test_profile_0516.py`` re-derive the tables from the released source.

SGLang parses them with ``argparse.ArgumentParser(prog="sglang serve")`` (``allow_abbrev`` left
True), so an unambiguous prefix of a flag selects it; :func:`eagle3.engines.sglang.serving.
canonical_flag` applies that rule to ``serve.extra_args``.
"""

from __future__ import annotations

from eagle3.engines.sglang.profile import VERSION

# Canonical flags that take exactly one value; with the switches and MULTI below they are every
# canonical flag (:data:`CANONICAL`).
ONE_VALUE = frozenset("""
--admin-api-key --api-key --asr-max-buffer-seconds --asr-max-concurrent-sessions --attention-backend
--attn-cp-size --attn-dp-size --base-gpu-id --batch-notify-size --bf16-gemm-backend
--boundary-reduction --c128-page-size --chat-template --chunked-prefill-size --completion-template
--config --constrained-json-max-whitespace-cnt --constrained-json-whitespace-pattern
--context-length --cp-strategy --cpu-offload-gb --crash-dump-folder --cuda-graph-backend-decode
--cuda-graph-backend-prefill --cuda-graph-config --cuda-graph-max-bs-decode
--cuda-graph-max-bs-prefill --cuda-graph-max-seq-len-prefill --cuda-graph-prefill-max-context
--dcp-comm-backend --dcp-size --debug-tensor-dump-input-file --debug-tensor-dump-output-folder
--decode-attention-backend --decode-log-interval --decoupled-spec-bind-endpoint
--decoupled-spec-connect-endpoints --decoupled-spec-rank --decoupled-spec-role
--decrypted-config-file --decrypted-draft-config-file --deepep-config
--deepep-dispatcher-output-dtype --deepep-mode --deepep-v2-mode --default-chat-template-kwargs
--default-priority-value --detokenizer-worker-num --device --disaggregation-bootstrap-port
--disaggregation-decode-allocation-policy --disaggregation-decode-extra-slots
--disaggregation-decode-host-receive-threshold --disaggregation-decode-polling-interval
--disaggregation-decode-retraction-backup --disaggregation-ib-device --disaggregation-mode
--disaggregation-transfer-backend --dist-init-addr --dist-timeout --dllm-algorithm
--dllm-algorithm-config --download-dir --dp-size --dsa-decode-backend --dsa-paged-mqa-logits-backend
--dsa-prefill-backend --dsa-topk-backend --dsa-triton-union --dsv4-attn-backend
--dsv4-prefill-backend --dtype --dwdp-size --dynamic-batch-tokenizer-batch-size
--dynamic-batch-tokenizer-batch-timeout --elastic-ep-backend --elastic-ep-initial-size
--elastic-ep-join-mode --elastic-ep-join-rank-offset --elastic-ep-scale-timeout
--encoder-bootstrap-port --encoder-transfer-backend --engine-info-bootstrap-port
--ep-dispatch-algorithm --ep-num-redundant-experts --ep-size --eplb-algorithm
--eplb-min-rebalancing-utilization-threshold --eplb-rebalance-layers-per-chunk
--eplb-rebalance-num-iterations --expert-balancedness-report-mode
--expert-distribution-recorder-buffer-size --expert-distribution-recorder-mode
--export-metrics-to-file-dir --extra-metric-labels --fastapi-root-path --file-storage-path
--flashinfer-a2a-dispatch-type --flashinfer-allreduce-fusion-backend
--flashinfer-mxfp4-moe-precision --flexkv-config-file --forward-hooks
--forward-pass-metrics-ipc-name --forward-pass-metrics-worker-id --fp4-gemm-backend
--fp8-gemm-backend --fuseep-mode --gated-launch-port --gc-warning-threshold-secs --gpu-id-step
--grammar-backend --grpc-port --grpc-response-timeout-secs --hf-chat-template-name
--hicache-host-memory-fraction --hicache-host-memory-mode --hicache-io-backend --hicache-mem-layout
--hicache-ratio --hicache-size --hicache-storage-backend --hicache-storage-backend-extra-config
--hicache-storage-prefetch-policy --hicache-storage-prefetch-retry-max-attempts
--hicache-storage-prefetch-retry-poll-interval --hicache-write-policy --hisparse-config --host
--http2-initial-connection-window-size --http2-max-concurrent-streams --image-processor-backend
--init-expert-location --int8-mamba-ckpt-size --json-model-override-args --kt-cpuinfer
--kt-max-deferred-experts-per-token --kt-method --kt-num-gpu-experts --kt-threadpool-count
--kt-weight-path --kv-cache-dtype --kv-canary --kv-canary-real-data --kv-canary-sweep-interval
--kv-events-config --limit-mm-data-per-request --linear-attn-backend --linear-attn-decode-backend
--linear-attn-prefill-backend --linear-attn-verify-backend --linear-replayssm-cache-len
--lmcache-config-file --load-balance-method --load-format --load-publish-endpoint
--load-snapshot-publish-interval --log-level --log-level-http --log-requests-format
--log-requests-level --lora-backend --lora-drain-wait-threshold --lora-eviction-policy
--mamba-backend --mamba-cache-philox-rounds --mamba-full-memory-ratio --mamba-max-states-per-path
--mamba-radix-cache-strategy --mamba-ssm-dtype --mamba-track-interval --max-ep-size
--max-loaded-loras --max-lora-chunk-size --max-lora-rank --max-loras-per-batch
--max-mamba-cache-size --max-prefill-tokens --max-queued-requests --max-running-requests
--max-total-tokens --media-url-max-file-size-mb --mem-fraction-static --min-free-slots-delay
--mm-attention-backend --mm-feature-transport --mm-global-cache-backend --mm-io-worker-num
--mm-preprocess-cache-size-mb --mm-process-config --mm-processor-worker-num --model-config-parser
--model-impl --model-loader-extra-config --model-path --modelexpress-config
--modelopt-checkpoint-restore-path --modelopt-checkpoint-save-path --modelopt-export-path
--modelopt-quant --moe-a2a-backend --moe-dense-tp-size --moe-dp-size --moe-runner-backend
--mooncake-ib-device --msprobe-dump-config --nccl-port --nnodes --node-rank
--num-continuous-decode-steps --num-reserved-decode-tokens --offload-group-size --offload-mode
--offload-num-in-group --offload-prefetch-step --optimistic-prefill-attempts --otlp-service-name
--otlp-traces-endpoint --page-size --paged-experts-num-resident --pdmux-config-path
--ple-offload-backend --ple-offload-dir --port --pp-async-batch-depth --pp-max-micro-batch-size
--pp-size --preferred-sampling-params --prefill-attention-backend --prefill-decode-interval
--prefill-decode-interval-min-bs --prefill-delayer-max-delay-ms --prefill-delayer-max-delay-passes
--prefill-delayer-queue-min-ratio --prefill-delayer-token-usage-low-watermark
--prefill-kv-cache-dequant-dtype --prefill-max-requests --priority-scheduling-preemption-threshold
--qsa-indexer-dtype --quantization --quantization-param-path --radix-cache-backend
--radix-eviction-policy --radix-eviction-policy-config --random-seed --reasoning-parser
--remote-instance-weight-loader-backend --remote-instance-weight-loader-seed-instance-ip
--remote-instance-weight-loader-seed-instance-service-port
--remote-instance-weight-loader-send-weights-group-ports --retraction-policy
--return-hidden-states-mode --revision --rl-on-policy-target --rl-quant-profile --sampling-backend
--sampling-defaults --sampling-mask-max-tokens --schedule-conservativeness --schedule-policy
--scheduler-recv-interval --served-model-name --shared-experts-tp-size --sidecar --sidecar-args
--sm-group-num --smg-http-sidecar-port --soft-watchdog-timeout --spec-trace-dir
--speculative-accept-threshold-acc --speculative-accept-threshold-single
--speculative-adaptive-config --speculative-algorithm --speculative-attention-mode
--speculative-dflash-block-size --speculative-domino-candidate-pool-size
--speculative-draft-attention-backend --speculative-draft-kv-cache-dtype
--speculative-draft-load-format --speculative-draft-model-path
--speculative-draft-model-quantization --speculative-draft-model-revision
--speculative-draft-sink-size --speculative-draft-window-size --speculative-dsa-topk-backend
--speculative-dspark-block-size --speculative-dspark-confidence-sts-path
--speculative-dspark-sps-table-path --speculative-eagle-topk --speculative-moe-a2a-backend
--speculative-moe-runner-backend --speculative-ngram-capacity
--speculative-ngram-external-corpus-max-tokens --speculative-ngram-external-corpus-path
--speculative-ngram-external-sam-budget --speculative-ngram-match-type
--speculative-ngram-max-bfs-breadth --speculative-ngram-max-trie-depth
--speculative-ngram-min-bfs-breadth --speculative-num-draft-tokens --speculative-num-steps
--speculative-token-map --ssl-ca-certs --ssl-certfile --ssl-keyfile --ssl-keyfile-password
--startup-weight-load-mode --stream-interval --swa-full-tokens-ratio --swa-prefix-tails
--tbo-token-distribution-threshold --tokenizer-backend --tokenizer-metrics-custom-labels-header
--tokenizer-mode --tokenizer-path --tokenizer-worker-num --tool-call-parser --tool-server
--torch-compile-max-bs --tp-size --trace-modules --triton-attention-num-kv-splits
--triton-attention-split-tile-size --unified-cache-external-linker-backend
--unified-cache-external-linker-config --uno-lora-path --warmups --watchdog-timeout
--watermark-config --weight-cache-mode --weight-cache-socket --weight-cache-timeout
--weight-loader-prefetch-num-threads --weight-version
""".split())

# alias -> canonical flag (``Arg(aliases=[...])``); both names set the same field
ALIASES = {
    '--attention-context-parallel-size': '--attn-cp-size',
    '--attention-data-parallel-size': '--attn-dp-size',
    '--context-bucket': '--cuda-graph-prefill-max-context', '--data-parallel-size': '--dp-size',
    '--decode-context-parallel-size': '--dcp-size',
    '--enable-hicache': '--enable-hierarchical-cache', '--ep': '--ep-size',
    '--expert-parallel-size': '--ep-size', '--grpc-http-sidecar-port': '--smg-http-sidecar-port',
    '--hierarchical-sparse-attention-extra-config': '--hisparse-config', '--model': '--model-path',
    '--moe-data-parallel-size': '--moe-dp-size', '--monokernel-backend': '--enable-amd-monokernel',
    '--nccl-init-addr': '--dist-init-addr', '--pipeline-parallel-size': '--pp-size',
    '--speculative-draft-model': '--speculative-draft-model-path',
    '--tensor-parallel-size': '--tp-size',
}

# ``argparse.BooleanOptionalAction`` flags: argparse adds ``--no-<flag>``, which sets the same field
NEGATABLE = frozenset("""
--dcp-replicate-q-proj --dllm-fdfo --enable-decoder-swa-bounded-replay --enable-dsa-fused-indexer
--enable-fused-qk-norm-rope --enable-tf32-matmul --enable-tp-lm-head-all-to-all
--experts-shared-outer-loras --lora-strict-loading --mm-enable-dp-encoder --ple-offload-embedding
--speculative-enable-w4a4-mxfp4-megamoe
""".split())
NEGATIONS = {f"--no-{f[2:]}": f for f in NEGATABLE}

# How many values each option takes (``nargs``), read from the same source: every option that is
# not listed takes exactly one value. SWITCHES take none (``bool`` fields are ``store_true``;
# ``BooleanOptionalAction`` and the ``Deprecated*`` switch actions); MULTI lists ``"?"``, ``"*"``
# and ``"+"``. 0.5.23's tables; 0.5.16 differs by NARGS_ONLY_0516 (:func:`nargs`).
SWITCHES = frozenset("""
--abort-on-priority-when-disabled --allow-auto-truncate
--checkpoint-engine-wait-weights-before-ready --constrained-json-disable-any-whitespace
--dcp-replicate-q-proj --debug-cuda-graph --delete-ckpt-after-loading
--disable-aiter-allreduce-fusion-in-decode --disable-aiter-allreduce-fusion-in-prefill
--disable-attn-tp-gather --disable-chunked-prefix-cache --disable-cuda-graph
--disable-cuda-graph-padding --disable-custom-all-reduce --disable-decode-cuda-graph
--disable-fast-image-processor --disable-flashinfer-autotune
--disable-flashinfer-cutlass-moe-fp4-allgather --disable-hybrid-swa-memory
--disable-outlines-disk-cache --disable-overlap-schedule --disable-prefill-cuda-graph
--disable-priority-preemption --disable-radix-cache --disable-shared-experts-fusion
--disable-tokenizer-batch-decode --disaggregation-decode-enable-offload-kvcache
--disaggregation-decode-enable-radix-cache --disaggregation-enable-kv-checksum --dllm-fdfo
--enable-adaptive-dispatch-to-encoder --enable-aiter-allreduce-fusion --enable-amd-monokernel
--enable-attn-tp-input-scattered --enable-broadcast-mm-inputs-process --enable-cache-report
--enable-cp-decode-attn-tp --enable-cudagraph-gc --enable-custom-logit-processor
--enable-decoder-swa-bounded-replay --enable-deepseek-v4-fp4-indexer --enable-dense-mlp-attn-tp
--enable-deterministic-inference --enable-dp-attention --enable-dp-attention-local-control-broadcast
--enable-dp-lm-head --enable-draft-weights-cpu-backup --enable-dsa-cache-layer-split
--enable-dsa-fused-indexer --enable-dynamic-batch-tokenizer --enable-dynamic-chunking
--enable-elastic-expert-backup --enable-encoder-swa-bounded-replay --enable-eplb
--enable-flashinfer-allreduce-fusion --enable-flexkv --enable-forward-pass-metrics
--enable-fp32-lm-head --enable-fused-moe-sum-all-reduce --enable-fused-qk-norm-rope --enable-hicache
--enable-hierarchical-cache --enable-hisparse --enable-http-worker-reuseport --enable-http2
--enable-int8-mamba-checkpoint --enable-kv-cache-sharding --enable-layernorm-sp
--enable-layerwise-nvtx-marker --enable-lean-attention --enable-linear-replayssm
--enable-linear-replayssm-spec --enable-linker-mla-dedup --enable-lmcache --enable-lora
--enable-lora-overlap-loading --enable-mamba-cache-stochastic-rounding
--enable-megamoe-for-layernorm-sp --enable-memory-saver --enable-metrics
--enable-metrics-for-all-schedulers --enable-mfu-metrics --enable-mis --enable-mixed-chunk
--enable-mm-global-cache --enable-mscclpp --enable-multi-layer-eagle --enable-multimodal
--enable-nccl-nvls --enable-nvidia-megakernel --enable-p2p-check --enable-page-major-kv-layout
--enable-paged-experts --enable-pd-role-switch --enable-pdmux
--enable-precise-embedding-interpolation --enable-prefill-cp --enable-prefill-delayer
--enable-prefix-mm-cache --enable-priority-scheduling --enable-profile-cuda-graph
--enable-quant-communications --enable-request-time-stats-logging --enable-response-store
--enable-return-aux-hidden-states --enable-return-hidden-states --enable-return-indexer-topk
--enable-return-routed-experts --enable-scattered-sconv --enable-session-radix-cache
--enable-shared-experts-attn-tp --enable-single-batch-overlap --enable-ssl-refresh
--enable-streaming-session --enable-strict-thinking --enable-symm-mem --enable-tf32-matmul
--enable-tokenizer-batch-encode --enable-torch-compile --enable-torch-compile-debug-mode
--enable-torch-symm-mem --enable-tp-lm-head-all-to-all --enable-trace --enable-two-batch-overlap
--enable-unified-cache-external-linker --enable-unified-memory --enable-w4a4-mxfp4-megamoe
--enable-waterfill --enable-watermark --enable-weights-cpu-backup --encoder-only
--enforce-disable-flashinfer-allreduce-fusion --enforce-shared-experts-fusion
--experts-shared-outer-loras --export-metrics-to-file --flashinfer-mla-disable-ragged --grpc-mode
--incremental-streaming-output --is-embedding --language-model-only --language-only --log-requests
--lora-strict-loading --lora-use-virtual-experts --mlx-enable-sampling --mm-enable-dp-encoder
--ple-offload-embedding --pre-warm-nccl --prefill-only-disable-kv-cache --quantize-and-serve
--remote-instance-weight-loader-start-seed-via-transfer-engine --return-input-ids
--return-output-ids --schedule-low-priority-values-first --show-time-cost --skip-server-warmup
--skip-tokenizer-init --sleep-on-idle --smg-grpc-mode --speculative-adaptive
--speculative-dspark-align-verify-tokens-to-graph-tier --speculative-enable-w4a4-mxfp4-megamoe
--speculative-use-block-verification --speculative-use-rejection-sampling
--stream-response-default-include-usage --strip-thinking-cache --triton-attention-reduce-in-fp32
--trust-mm-content-hashes --trust-remote-code --trust-request-chat-template --use-ray
--weight-loader-disable-mmap --weight-loader-drop-cache-after-load
--weight-loader-prefetch-checkpoints
""".split()) | frozenset(NEGATIONS)
MULTI = {**dict.fromkeys("""
--allowed-media-domains --bucket-e2e-request-latency --bucket-inter-token-latency
--bucket-time-to-first-token --cuda-graph-bs-decode --cuda-graph-bs-prefill
--debug-tensor-dump-layers --encoder-register-urls --encoder-urls --flashinfer-autotune-skip-ops
--gc-threshold --generation-tokens-buckets --log-requests-target --numa-node
--prefill-delayer-forward-passes-buckets --prefill-delayer-wait-seconds-buckets
--prompt-tokens-buckets --return-aux-hidden-state-layer-ids
--tokenizer-metrics-allowed-custom-labels
""".split(), "+"), "--model-checksum": "?",
         **dict.fromkeys(["--custom-weight-loader", "--lora-paths", "--lora-target-modules",
                          "--uvicorn-access-log-exclude-prefixes"], "*")}
CANONICAL = ONE_VALUE | (SWITCHES - set(ALIASES) - set(NEGATIONS)) | frozenset(MULTI)
OPTIONS = {**{f: f for f in CANONICAL}, **ALIASES, **NEGATIONS, "-h": "--help", "--help": "--help"}

# SGLang 0.5.16 builds the same parser from ``ServerArgs`` itself (``server_args.py``): its table
# is 0.5.23's less :data:`NOT_IN_0516`, plus :data:`ONLY_0516` (deprecated spellings there map to
# the flag whose field they set). Re-derived from that wheel by tests/unit/test_profile_0516.py.
NOT_IN_0516 = frozenset("""
--allowed-media-domains --attention-data-parallel-size --attn-dp-size --boundary-reduction
--c128-page-size --constrained-json-max-whitespace-cnt --context-bucket
--cuda-graph-max-seq-len-prefill --cuda-graph-prefill-max-context --dcp-comm-backend
--dcp-replicate-q-proj --deepep-v2-mode --disable-aiter-allreduce-fusion-in-decode
--disable-aiter-allreduce-fusion-in-prefill --disaggregation-decode-allocation-policy
--disaggregation-decode-host-receive-threshold --disaggregation-decode-retraction-backup
--disaggregation-enable-kv-checksum --dsa-triton-union --dsv4-attn-backend --dsv4-prefill-backend
--dwdp-size --enable-amd-monokernel --enable-cp-decode-attn-tp --enable-decoder-swa-bounded-replay
--enable-dense-mlp-attn-tp --enable-dsa-fused-indexer --enable-encoder-swa-bounded-replay
--enable-hicache --enable-http-worker-reuseport --enable-kv-cache-sharding --enable-layernorm-sp
--enable-lean-attention --enable-linear-replayssm-spec --enable-linker-mla-dedup
--enable-megamoe-for-layernorm-sp --enable-nvidia-megakernel --enable-paged-experts
--enable-pd-role-switch --enable-response-store --enable-return-aux-hidden-states
--enable-shared-experts-attn-tp --enable-tp-lm-head-all-to-all
--enable-unified-cache-external-linker --enable-w4a4-mxfp4-megamoe --enable-watermark
--expert-balancedness-report-mode --flashinfer-a2a-dispatch-type --flashinfer-autotune-skip-ops
--gated-launch-port --grpc-response-timeout-secs --hicache-host-memory-fraction
--hicache-host-memory-mode --hicache-storage-prefetch-retry-max-attempts
--hicache-storage-prefetch-retry-poll-interval --http2-initial-connection-window-size
--http2-max-concurrent-streams --image-processor-backend --language-model-only
--linear-attn-verify-backend --load-publish-endpoint --mamba-max-states-per-path
--media-url-max-file-size-mb --mlx-enable-sampling --mm-global-cache-backend --mm-io-worker-num
--mm-preprocess-cache-size-mb --mm-processor-worker-num --monokernel-backend --otlp-service-name
--paged-experts-num-resident --ple-offload-backend --ple-offload-dir --ple-offload-embedding
--prefill-decode-interval --prefill-decode-interval-min-bs --prefill-kv-cache-dequant-dtype
--qsa-indexer-dtype --radix-eviction-policy-config --return-aux-hidden-state-layer-ids
--return-hidden-states-mode --return-input-ids --return-output-ids --sampling-mask-max-tokens
--shared-experts-tp-size --speculative-domino-candidate-pool-size
--speculative-draft-kv-cache-dtype --speculative-draft-sink-size --speculative-dsa-topk-backend
--speculative-enable-w4a4-mxfp4-megamoe --speculative-use-block-verification
--startup-weight-load-mode --swa-prefix-tails --trust-mm-content-hashes
--trust-request-chat-template --unified-cache-external-linker-backend
--unified-cache-external-linker-config --uno-lora-path --watermark-config --weight-cache-mode
--weight-cache-socket --weight-cache-timeout
--no-dcp-replicate-q-proj --no-enable-decoder-swa-bounded-replay --no-enable-dsa-fused-indexer
--no-enable-fused-qk-norm-rope --no-enable-tf32-matmul --no-enable-tp-lm-head-all-to-all
--no-mm-enable-dp-encoder --no-ple-offload-embedding --no-speculative-enable-w4a4-mxfp4-megamoe
""".split())
ONLY_0516 = {**{f: f for f in """
--collect-tokens-histogram --cuda-graph-tc-compiler --dsa-prefill-cp-mode --elastic-ep-rejoin
--enable-dsa-prefill-context-parallel --enable-expert-distribution-metrics
--enable-gdn-replayssm-spec --enable-prefill-context-parallel --keep-mm-feature-on-device
--prefill-cp-mode --prefill-round-robin-balance --speculative-skip-dp-mlp-sync --torchao-config
""".split()},
    '--cuda-graph-bs': '--cuda-graph-bs-decode',
    '--cuda-graph-max-bs': '--cuda-graph-max-bs-decode',
    '--disable-piecewise-cuda-graph': '--cuda-graph-backend-prefill',
    '--enable-breakable-cuda-graph': '--cuda-graph-backend-prefill',
    '--enable-nsa-prefill-context-parallel': '--enable-dsa-prefill-context-parallel',
    '--enforce-piecewise-cuda-graph': '--cuda-graph-backend-prefill',
    '--mamba-scheduler-strategy': '--mamba-radix-cache-strategy',
    '--nsa-decode-backend': '--dsa-decode-backend',
    '--nsa-prefill-backend': '--dsa-prefill-backend',
    '--nsa-prefill-cp-mode': '--dsa-prefill-cp-mode',
    '--piecewise-cuda-graph-compiler': '--cuda-graph-tc-compiler',
    '--piecewise-cuda-graph-max-tokens': '--cuda-graph-max-bs-prefill',
    '--piecewise-cuda-graph-tokens': '--cuda-graph-bs-prefill',
    '--speculative-dflash-draft-window-size': '--speculative-draft-window-size',
    '--stream-output': '--incremental-streaming-output'}
NARGS_ONLY_0516 = {**dict.fromkeys("""
--collect-tokens-histogram --disable-piecewise-cuda-graph --elastic-ep-rejoin
--enable-breakable-cuda-graph --enable-dsa-prefill-context-parallel
--enable-expert-distribution-metrics --enable-gdn-replayssm-spec
--enable-nsa-prefill-context-parallel --enable-prefill-context-parallel
--enforce-piecewise-cuda-graph --keep-mm-feature-on-device --prefill-round-robin-balance
--speculative-skip-dp-mlp-sync --stream-output
""".split(), "0"), "--cuda-graph-bs": "+", "--piecewise-cuda-graph-tokens": "+"}


def options(version: str) -> dict[str, str]:
    """``{option string: canonical flag}`` of ``launch_server`` in SGLang ``version`` (a key of
    ``eagle3.engines.sglang.profile.RELEASES``); KeyError for another release."""
    if version == "0.5.16":
        return {**{k: v for k, v in OPTIONS.items() if k not in NOT_IN_0516}, **ONLY_0516}
    return {VERSION: OPTIONS}[version]


def nargs(version: str) -> dict[str, str]:
    """``{option string: nargs}`` of ``launch_server`` in SGLang ``version`` for every option that
    does not take exactly one value: ``"0"`` (a switch; ``-h``/``--help`` included), ``"?"``,
    ``"*"`` or ``"+"``. KeyError for a release not in ``profile.RELEASES``."""
    table = {**{f: "0" for f in SWITCHES}, **MULTI, "-h": "0", "--help": "0"}
    if version == "0.5.16":
        known = options(version)
        return {**{k: v for k, v in table.items() if k in known}, **NARGS_ONLY_0516}
    return {VERSION: table}[version]
