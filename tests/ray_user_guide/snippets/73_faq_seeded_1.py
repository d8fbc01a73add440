# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/faq.md
# code:    doc_code/faq.py @ 001716f97ea2 (train.report / train.RunConfig form)
# markers: __seeded_1_start__ .. _end__
# kind:    literalinclude

# --- snippet (as the guide shows it) ---
import random

random.seed(1234)
output = [random.randint(0, 100) for _ in range(10)]

# The output will always be the same.
assert output == [99, 56, 14, 0, 11, 74, 4, 85, 88, 10]
