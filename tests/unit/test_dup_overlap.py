"""lab/dup_overlap.py's measures by hand: shingles and Jaccard, the n-gram hashes and document
frequencies, loss positions by answer, the overlap shares and the prompt duplicates."""

from __future__ import annotations

from lab.dup_overlap import (doc_freq, gram_hashes, jaccard, loss_positions, overlap, prompt_dups,
                             shingles)


def test_shingles_and_jaccard():
    assert shingles("a b") == frozenset({("a", "b")})
    assert len(shingles("one two three four five six")) == 2
    assert jaccard(shingles("A  b c d e"), shingles("a b c d e")) == 1.0
    assert jaccard(frozenset(), frozenset()) == 1.0
    assert jaccard(frozenset({1}), frozenset({2})) == 0.0


def test_ngram_hashes_and_document_frequencies():
    h = gram_hashes([1, 2, 1, 2], 2)
    assert len(h) == 3 and h[0] == h[2] != h[1]
    assert len(gram_hashes([1], 2)) == 0
    keys, counts = doc_freq([[1, 2, 1, 2], [2, 1]], 2)
    assert sorted(counts.tolist()) == [1, 2]  # (1,2) in one sequence, (2,1) in both


def test_loss_positions_restart_at_each_answer_and_overlap_counts_hits():
    assert loss_positions([0, 1, 1, 0, 1]) == [(1, 0, 0), (2, 1, 0), (4, 0, 1)]
    table = doc_freq([[5, 6, 7]], 2)
    got = overlap([([5, 6, 9], [(0, 0, 0), (1, 1, 0), (2, 2, 0)])], table, 2, 1, [64])
    assert got["too_early"] == 1
    assert got["all"] == {"positions": 3, "found": 1, "share": round(1 / 3, 4)}
    assert got["turn1"]["found"] == 1 and got["0-63"]["positions"] == 3


def test_prompt_duplicates_leave_the_sample_itself_out():
    train = {"t1": "Hello  there", "t2": "write a poem about the sea please"}
    texts = {"v1": "hello there", "t1": "Hello there",
             "v2": "write a poem about the sea now"}
    got = prompt_dups(texts, train, 0.5)
    assert got["rows"]["v1"]["exact"] == ["t1"] and got["rows"]["t1"]["exact"] == []
    assert got["rows"]["v2"]["nearest"] == "t2" and got["rows"]["v2"]["jaccard"] == 0.5
    assert (got["n"], got["exact"], got["near"]) == (3, 1, 2)
