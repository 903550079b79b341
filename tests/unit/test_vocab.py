import pytest
import torch

from eagle3.errors import ConfigError, DataError
from eagle3.train.vocab import (
    VocabMap,
    build_vocab_map,
    check_vocab_map,
    load_token_freq,
    vocab_map_hash,
)


def _freq():
    # ids 10..29 with counts 20..1 (id 10 most frequent), plus a tie pair
    f = {10 + i: 20 - i for i in range(20)}
    f[40] = 5  # ties with id 25 (count 5): the lower id wins
    return f


def test_most_frequent_ids_in_ascending_order():
    vm = build_vocab_map(_freq(), 6, 64)
    assert vm.target_ids().tolist() == [10, 11, 12, 13, 14, 15]
    assert vm.d2t.dtype == torch.long and vm.t2d.dtype == torch.bool
    assert vm.d2t.tolist() == [10] * 6  # target_id = i + d2t[i]
    assert torch.nonzero(vm.t2d).flatten().tolist() == [10, 11, 12, 13, 14, 15]
    assert vm.num_from_data == 6
    covered = sum(20 - i for i in range(6))
    assert vm.coverage == pytest.approx(covered / sum(_freq().values()))


def test_tie_broken_by_lower_id():
    vm = build_vocab_map(_freq(), 16, 64)
    assert 25 in vm.target_ids().tolist() and 40 not in vm.target_ids().tolist()


def test_fewer_distinct_tokens_is_an_error_naming_both_numbers():
    with pytest.raises(DataError, match=r"21 distinct.*draft_vocab_size=32.*pad_draft_vocab"):
        build_vocab_map(_freq(), 32, 64)


def test_padding_fills_lowest_unused_ids():
    vm = build_vocab_map(_freq(), 24, 64, pad=True)
    assert vm.num_from_data == 21
    ids = vm.target_ids().tolist()
    assert [0, 1, 2] == ids[:3]  # padding ids
    assert set(_freq()).issubset(ids)
    check_vocab_map(vm.d2t, vm.t2d, 64)


def test_out_of_range_token_and_bad_size():
    with pytest.raises(DataError, match="outside"):
        build_vocab_map({70: 3, 1: 2, 2: 2}, 2, 64)
    with pytest.raises(ConfigError, match="draft_vocab_size"):
        build_vocab_map(_freq(), 64, 64)


def test_hash_is_stable_and_content_sensitive():
    a, b = build_vocab_map(_freq(), 6, 64), build_vocab_map(_freq(), 6, 64)
    assert a.hash() == b.hash() == vocab_map_hash(a.d2t.int(), a.t2d.to(torch.uint8))
    c = build_vocab_map({**_freq(), 50: 100}, 6, 64)
    assert c.hash() != a.hash()


def test_invariant_checks():
    vm = build_vocab_map(_freq(), 6, 64)
    with pytest.raises(DataError, match="t2d: expected length vocab_size=64, got shape \\[63\\]"):
        check_vocab_map(vm.d2t, vm.t2d[:-1], 64)
    t2d = vm.t2d.clone()
    t2d[50] = True
    with pytest.raises(DataError, match="t2d: sum expected draft_vocab_size=6, got 7"):
        check_vocab_map(vm.d2t, t2d, 64)
    d2t = vm.d2t.clone()
    d2t[0] = -20
    with pytest.raises(DataError, match="i \\+ d2t"):
        check_vocab_map(d2t, vm.t2d, 64)
    ids = vm.target_ids()  # the same ids, two swapped: a valid map, not in training's order
    ids[[0, 1]] = ids[[1, 0]]
    with pytest.raises(DataError, match="expected ascending in i"):
        check_vocab_map(ids - torch.arange(6), vm.t2d, 64)
    assert isinstance(vm, VocabMap)


def test_load_token_freq(tmp_path):
    p = tmp_path / "token_freq.pt"
    torch.save({3: 4, 5: 1}, p)
    assert load_token_freq(p) == {3: 4, 5: 1}
    torch.save([1, 2], p)
    with pytest.raises(DataError, match="expected a dict"):
        load_token_freq(p)
    with pytest.raises(DataError, match="not found"):
        load_token_freq(tmp_path / "missing.pt")
