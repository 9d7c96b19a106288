"""Where images and weights come from: data sets, sample selection and classifier checkpoints.

- :mod:`harness.sources.datasets` -- CIFAR-10, CIFAR-100, SVHN; deterministic sample selection.
- :mod:`harness.sources.models`   -- pyautoattack's ResNet-18, user checkpoints, RobustBench names.
- :mod:`harness.sources.corruptions` -- CIFAR-10-C's common corruptions, generated deterministically and cached.
"""
