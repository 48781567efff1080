import pytest

from parity.observe.partition import chunk_sizes, shard_sizes, shard_slice, split_sizes


@pytest.mark.parametrize("total,parts,grain,expected", [
    (11, 2, 1, [6, 5]),
    (10, 3, 1, [4, 3, 3]),
    (35, 2, 1, [18, 17]),
    (269, 2, 1, [135, 134]),
    (34, 4, 1, [9, 9, 8, 8]),
    (35, 3, 1, [12, 12, 11]),
    (3, 4, 1, [1, 1, 1, 0]),
    # grain 8: 100 = 12 grains + 4; 12 grains over 3 ranks -> 4,4,4 grains; the last rank takes the 4 left over
    (100, 3, 8, [32, 32, 36]),
    (4, 2, 8, [2, 2]),  # fewer rows than one grain: near-even
])
def test_shard_sizes(total, parts, grain, expected):
    assert shard_sizes(total, parts, grain) == expected
    assert sum(expected) == total


def test_slices_tile_the_whole_range():
    slices = [shard_slice(269, 3, r) for r in range(3)]
    assert slices[0].start == 0 and slices[-1].stop == 269
    assert all(a.stop == b.start for a, b in zip(slices, slices[1:]))


@pytest.mark.parametrize("total,parts,expected", [
    (34, 2, [17, 17]),
    (35, 2, [18, 17]),
    (34, 3, [12, 12, 10]),  # near-even would be 12, 11, 11
    (34, 4, [9, 9, 9, 7]),  # near-even: 9, 9, 8, 8
    (5, 4, [2, 2, 1, 0]),
    (9, 4, [3, 3, 3, 0]),  # fewer non-empty shards than ranks
    (3, 4, [1, 1, 1, 0]),
    (0, 2, [0, 0]),
])
def test_chunk_sizes_are_torch_chunk_by_our_own_arithmetic(total, parts, expected):
    assert chunk_sizes(total, parts) == expected
    assert split_sizes(total, parts, split="chunk") == expected
    # torch.chunk itself, as a witness only (it may return fewer chunks)
    import torch
    got = [len(c) for c in torch.arange(total).chunk(parts)] if total else []
    assert got + [0] * (parts - len(got)) == expected


def test_unknown_split_is_named():
    with pytest.raises(ValueError, match="split must be one of"):
        split_sizes(10, 2, split="even")
