"""The battery: which attacks run, with which options, gradient mode and EOT draws.

- :mod:`harness.battery.presets` -- ``AttackSpec`` entries from a preset, a TOML file or attack names.
- :mod:`harness.battery.resolve` -- the one resolver of each attack's gradient mode and EOT draws.
"""
