# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/faq.md
# code:    doc_code/faq.py @ 001716f97ea2 (train.report / train.RunConfig form)
# markers: __torch_tf_seeds_start__ .. _end__
# kind:    literalinclude

# --- snippet (as the guide shows it) ---
import torch

torch.manual_seed(0)

import tensorflow as tf

tf.random.set_seed(0)
