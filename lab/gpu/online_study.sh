#!/usr/bin/env bash
# The GPU figures of lab/online_vs_offline.py in one background run on a lent GPU machine
# (lab/plans/online-h200-calls.md; start it with `bash lab/gpu/h200_sglang.sh bg bash THIS`).
# Each part writes its results JSON under $R after every case; a failed part does not stop the next.
#   1  SmolLM2, 3,000 ShareGPT conversations as they are, 1 epoch: offline, online (cached for one
#      epoch: 1.105x offline beside online's 1.091x on an H100, lab/NOTEBOOK.md)
#   2  SmolLM2, 300 conversations, 20 epochs (the GPU recipe's): offline, cached (0.45 GB window,
#      about half of the 0.87 GB an offline run stores)
#   3  the Llama-3.1-8B shape, random weights (SmolLM2's tokenizer), 300 conversations, 1 epoch:
#      offline, online (target and draft on one GPU)
#   4  part 2's cached mode with a 0.8 GB window (about 90 %)
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${RESULTS:-/tmp/h200}
ovo() { python3 lab/online_vs_offline.py configs/smollm2-gpu.yaml --device cuda \
          -o data.regenerate=none "$@"; echo "part exit $?"; }
ovo --epochs 1 --modes offline online \
    --work "$R/ovo1" --out "$R/ovo_smollm2_1ep.json"
rm -rf "$R/ovo1"  # 8.6 GB of stored states: the disk is needed for the 8B shape's folder (29 GB)
ovo --epochs 20 --modes offline cached -o data.num_conversations=300 -o extract.cache_max_gb=0.45 \
    --work "$R/ovo20" --out "$R/ovo_smollm2_20ep.json"
ovo --epochs 1 --modes offline online -o data.num_conversations=300 -o target.kind=tiny-random \
    -o target.tiny.hidden_size=4096 -o target.tiny.num_hidden_layers=32 \
    -o target.tiny.intermediate_size=14336 -o target.tiny.num_attention_heads=32 \
    -o target.tiny.num_key_value_heads=8 --work "$R/ovo8b" --out "$R/ovo_llama8b_shape_1ep.json"
ovo --epochs 20 --modes cached -o data.num_conversations=300 -o extract.cache_max_gb=0.8 \
    --work "$R/ovo20b" --out "$R/ovo_smollm2_20ep_window08.json"
