"""Per-request comparison of two speculative-decoding engines and the target's own greedy output
(pure functions, no engine): what ``lab/sglang_fidelity.py`` reports for SGLang 0.5.23 against the
CPU reference engine.

An engine's request record is ``{"output_ids": [int], "accept_counts": [int | None], "verify_ct":
int, "accepted": int}``: ``accept_counts[i]`` = draft tokens verify pass i accepted before any
truncation at the token budget (``None`` where the pass is not known individually: SGLang coalesced
passes into one streamed chunk), ``accepted`` = their sum as the engine counts it (SGLang:
``spec_num_correct_drafts``). Acceptance length follows the project's convention
(``eagle3.measure.acceptance.ACCEPTANCE_CONVENTION``): ``1 + accepted / verify passes``, bonus token
counted, 1.0 = nothing accepted.
"""

from __future__ import annotations

from eagle3.measure.acceptance import exact_acceptance_length


def passes_from_stream(
    tokens_so_far: list[int], verify_ct: int, correct_drafts: int
) -> list[int | None]:
    """Per-verify-pass accepted draft counts of one streamed SGLang 0.5.23 request.

    SGLang puts ``spec_verify_ct`` / ``spec_num_correct_drafts`` into ``meta_info`` only when the
    request finishes (``tokenizer_manager.py``: ``_calculate_spec_decoding_metrics`` is called in
    the ``finished`` branch), so the per-pass counts are read from the stream itself:
    ``tokens_so_far`` = output tokens after each streamed chunk (non-incremental stream: cumulative
    ``output_ids``). The first chunk is the prefill token; each later chunk is one scheduler step,
    i.e. one verify pass emitting its accepted drafts + the bonus token, so pass i accepted
    ``Δtokens_i - 1``. The last pass can be cut at the token budget: it gets what the final totals
    leave (``correct_drafts`` - the others). When the chunks are not one per pass (SGLang coalesced
    some because the client lagged: fewer than ``verify_ct`` + 1 chunks) the passes are not known
    individually: all ``None``. Raises ValueError when the token count goes backwards.
    """
    deltas = [b - a for a, b in zip([0, *tokens_so_far], tokens_so_far)]
    if any(d < 0 for d in deltas):
        raise ValueError(
            f"stream: output token counts {tokens_so_far} "
            f"go backwards; expected cumulative output_ids"
        )
    deltas = [
        d for d in deltas if d > 0
    ]  # chunks that only carry meta_info (the final one, say) emit nothing
    if len(deltas) != verify_ct + 1 or deltas[0] != 1:
        return [None] * verify_ct
    counts = [d - 1 for d in deltas[1:]]
    if counts:
        counts[-1] = correct_drafts - sum(counts[:-1])
        if counts[-1] < deltas[-1] - 1:  # the totals contradict the chunk sizes: do not guess
            return [None] * verify_ct
    return counts


def acceptance(rec: dict) -> float:
    """``1 + accepted / verify_ct`` of one engine record (or pooled totals); DataError when
    verify_ct is 0."""
    return exact_acceptance_length(int(rec["accepted"]), int(rec["verify_ct"]))


def first_difference(a: list, b: list) -> int | None:
    """Index of the first position where the sequences differ (the shorter one's length when one is
    a prefix of the other and they differ in length), or None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def pass_start_position(accept_counts: list[int], pass_index: int) -> int:
    """Output index of the first token verify pass ``pass_index`` emits: the prefill emits token 0,
    pass i emits ``accept_counts[i] + 1`` tokens (accepted drafts + bonus)."""
    return 1 + sum(a + 1 for a in accept_counts[:pass_index])


def compare_request(target_ids: list[int], ref: dict, sgl: dict) -> dict:
    """One request of both engines against the target's greedy output ``target_ids``.

    Returns ``{"outputs": {"reference_equals_target", "sglang_equals_target", "engines_equal",
    "first_output_difference"}, "acceptance": {"reference", "sglang"}, "accept_counts_equal",
    "first_pass_difference"}``. ``first_output_difference`` is None or ``{"engine", "position",
    "expected", "got"}`` (the first engine, in the order reference then sglang, whose output leaves
    the target's, and the first output index where it does); ``first_pass_difference`` is None or
    ``{"pass", "position", "reference", "sglang", "draft_step"}``: the first verify pass whose
    accepted count differs, the output index where that pass starts (the same in both engines as
    long as the outputs agree), and ``draft_step`` = ``min`` of the two counts, the first draft
    position one engine accepted and the other did not. Passes SGLang coalesced (None) are skipped;
    comparison stops at the first unknown pass when the earlier ones disagree.
    """
    first_out = None
    for engine, rec in (("reference", ref), ("sglang", sgl)):
        pos = first_difference(target_ids, rec["output_ids"])
        if pos is not None and first_out is None:
            first_out = {
                "engine": engine,
                "position": pos,
                "expected": target_ids[pos] if pos < len(target_ids) else None,
                "got": rec["output_ids"][pos] if pos < len(rec["output_ids"]) else None,
            }
    first_pass = None
    for i, (ra, sa) in enumerate(zip(ref["accept_counts"], sgl["accept_counts"])):
        if sa is None or ra is None:
            continue
        if ra != sa:
            first_pass = {
                "pass": i,
                "position": pass_start_position(ref["accept_counts"], i),
                "reference": ra,
                "sglang": sa,
                "draft_step": min(ra, sa),
            }
            break
    if first_pass is None and len(ref["accept_counts"]) != len(sgl["accept_counts"]):
        n = min(len(ref["accept_counts"]), len(sgl["accept_counts"]))
        first_pass = {
            "pass": n,
            "position": pass_start_position(ref["accept_counts"], n),
            "reference": None,
            "sglang": None,
            "draft_step": None,
            "note": "verify pass counts differ: "
            f"reference {len(ref['accept_counts'])}, sglang {len(sgl['accept_counts'])}",
        }
    return {
        "outputs": {
            "reference_equals_target": ref["output_ids"] == target_ids,
            "sglang_equals_target": sgl["output_ids"] == target_ids,
            "engines_equal": ref["output_ids"] == sgl["output_ids"],
            "first_output_difference": first_out,
        },
        "acceptance": {"reference": acceptance(ref), "sglang": acceptance(sgl)},
        "accept_counts_equal": first_pass is None,
        "first_pass_difference": first_pass,
    }


def pooled(records: list[dict]) -> dict:
    """Token-weighted totals of several requests of one engine: ``verify_ct``, ``accepted``,
    ``acceptance``."""
    tot = {
        "verify_ct": sum(r["verify_ct"] for r in records),
        "accepted": sum(r["accepted"] for r in records),
    }
    return tot | {"acceptance": acceptance(tot)}


def explain_margin(gap: float | None, scale: float, what: str) -> str:
    """Why two engines chose differently at one argmax, from the reference's logit gap between the
    two choices.

    ``gap``: the reference's logit of its own choice minus its logit of the other engine's choice
    (>= 0); ``scale``: max |logit| at that position. A gap below 1e-4 × scale (float32 carries ~7
    digits, and SGLang's Triton kernels sum in another order than torch's) is called a near-tie that
    float32 rounding can flip; a larger gap is not explained by rounding and is reported as a real
    difference.
    """
    if gap is None:
        return (
            f"{what}: the other engine's choice is outside "
            f"the draft vocabulary: not a rounding effect"
        )
    rel = gap / scale if scale > 0 else float("inf")
    if rel < 1e-4:
        return (
            f"{what}: near-tie in the argmax (gap {gap:.3g} = {rel:.2g} of "
            f"max |logit| {scale:.3g}): float32 rounding in a different "
            f"summation order (SGLang's Triton kernels vs torch) flips it"
        )
    return (
        f"{what}: gap {gap:.3g} ({rel:.2g} of max |logit| {scale:.3g}) is far above "
        f"float32 rounding: the engines compute different values here (not a tie)"
    )
