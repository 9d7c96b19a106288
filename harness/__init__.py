"""Adaptive-attack robustness evaluation harness.

Core concepts, one module each:

- :mod:`harness.defense`   -- the ``Defense`` interface (purifier + classifier) and gradient modes.
- :mod:`harness.registry`  -- registries for defenses, attacks and presets; plugin loading.
- :mod:`harness.target`    -- what an attack sees: gradients under a gradient mode, batched EOT, budget counting.
- :mod:`harness.losses`    -- per-sample attack losses (cross-entropy, margin, DLR).
"""

__version__ = "0.1.0"
