"""Training recipes: the ``Recipe`` contract and the resumable training loop behind ``harness train``.

- :mod:`harness.training.recipe` -- the recipe registry, checkpoints, resumption, the sidecar record.
"""
