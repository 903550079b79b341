"""Patches that let SGLang 0.5.23's EAGLE-3 path run on a CPU-only machine (test harness only).

On the generic platform (a CUDA build of torch with no GPU, ``SGLANG_USE_CPU_ENGINE`` unset),
``sglang.kernels.ops.speculative.spec_tree``
- never imports the CUDA tree builder, so ``build_tree_kernel_efficient_func`` raises ``NameError``
  on its last branch (``sgl_build_tree_kernel_efficient``), and
- ``verify_tree_greedy_func`` falls through to ``reject_out_of_tree_path``, a no-op for in-tree
  platforms: it **returns without verifying anything** (nothing accepted, nothing predicted).
Both are pointed at SGLang's own Triton implementations in the same module (the ones its XPU branch
uses), which run on the CPU under ``TRITON_INTERPRET=1``. ``sglang.srt.speculative.eagle_utils``
imports the two functions by name, so the module attributes must be replaced right after
``spec_tree`` executes and before anything imports from it: ``sitecustomize`` installs the
post-import hook that calls :func:`patch_spec_tree`.
"""

from __future__ import annotations

import os
import sys

SPEC_TREE_MODULE = "sglang.kernels.ops.speculative.spec_tree"
PATCHED_FLAG = "_eagle3_cpu_patched"


def patch_spec_tree(mod) -> None:
    """Replace ``build_tree_kernel_efficient_func`` / ``verify_tree_greedy_func`` in the
    ``spec_tree`` module.

    Raises:
        AttributeError: when the module lacks the Triton implementations (an SGLang version other
        than
            0.5.23 moved them): the harness must fail loudly, not serve unverified drafts.
    """
    triton_build = mod.sgl_build_tree_kernel_triton
    triton_verify = mod.verify_tree_greedy_triton

    def build_tree_kernel_efficient_func(
        parent_list,
        top_scores_index,
        seq_lens,
        tree_mask,
        positions,
        retrieve_index,
        retrieve_next_token,
        retrieve_next_sibling,
        topk,
        spec_steps,
        num_verify_tokens,
        tree_mask_mode,
    ):
        triton_build(
            parent_list,
            top_scores_index,
            seq_lens,
            tree_mask,
            positions,
            retrieve_index,
            retrieve_next_token,
            retrieve_next_sibling,
            topk,
            spec_steps,
            num_verify_tokens,
            tree_mask_mode,
        )

    def verify_tree_greedy_func(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrieve_index,
        retrieve_next_token,
        retrieve_next_sibling,
        target_predict,
        topk=-1,
    ):
        triton_verify(
            predicts=predicts,
            accept_index=accept_index,
            accept_token_num=accept_token_num,
            candidates=candidates,
            retrieve_index=retrieve_index,
            retrieve_next_token=retrieve_next_token,
            retrieve_next_sibling=retrieve_next_sibling,
            target_predict=target_predict,
        )
        return predicts, accept_index, accept_token_num

    mod.build_tree_kernel_efficient_func = build_tree_kernel_efficient_func
    mod.verify_tree_greedy_func = verify_tree_greedy_func
    setattr(mod, PATCHED_FLAG, True)
    if os.environ.get("EAGLE3_SHIMS_VERBOSE"):
        print(
            f"[eagle3 shims] patched {mod.__name__} in pid {os.getpid()}",
            file=sys.stderr,
            flush=True,
        )


PATCHES = {SPEC_TREE_MODULE: patch_spec_tree}
