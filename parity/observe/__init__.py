"""What a rank hands back and what the suite expects it to hold, in terms every layer shares: the
recorded tensors and facts (observations), collectives counted on the ranks, the suite's own
partition formula, the dtype names, and the capabilities of the machine.

May import: nothing from parity, nor references; only torch and numpy.
"""
