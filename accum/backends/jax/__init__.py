"""Keras' JAX backend (KERAS_BACKEND=jax): backend.py answers the seam (accum/backends/__init__.py), engine.py is
the accumulator, one jitted function per update over the state ``stateless_call`` and ``stateless_apply`` take."""
