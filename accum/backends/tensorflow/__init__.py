"""The TensorFlow backend: the accumulator's micro-step graph, its gradient caches, the one all-reduce, loss
scaling and the apply."""
