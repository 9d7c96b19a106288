"""Where images and weights come from: data sets, sample selection and classifier checkpoints.

- :mod:`harness.sources.datasets` -- CIFAR-10, CIFAR-100, SVHN; deterministic sample selection.
- :mod:`harness.sources.models`   -- a classifier from its spec: pyautoattack's ResNet-18, timm and torchvision
  architectures with a checkpoint, RobustBench names, user checkpoints.
- :mod:`harness.sources.zoo`      -- what timm, torchvision and RobustBench know about their models and weights.
- :mod:`harness.sources.normalization` -- the input normalization in front of a classifier, explicit and recorded.
- :mod:`harness.sources.corruptions` -- CIFAR-10-C's common corruptions, generated deterministically and cached.
"""
