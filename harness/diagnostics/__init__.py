"""Diagnostics: what tells a failed attack from a robust defense.

- :mod:`harness.diagnostics.preflight`  -- first-batch checks that the defense is a function of each input.
- :mod:`harness.diagnostics.check_table`     -- the after-stage checks, each with the condition it can fire under.
- :mod:`harness.diagnostics.after_stage` -- checks on each stage's outcome (gradients, EOT, convergence).
- :mod:`harness.diagnostics.gradient_measures`  -- gradient signal and finite-difference checks.
- :mod:`harness.diagnostics.escalation` -- the stronger attacks a flag adds.
- :mod:`harness.diagnostics.merge`      -- shard flags merged into the run's flags and escalations.
"""
