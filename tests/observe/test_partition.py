import pytest

from parity.observe.partition import shard_sizes, shard_slice


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
