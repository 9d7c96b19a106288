"""Certification: Gaussian randomized smoothing (CERTIFY and PREDICT) and certification runs.

- :mod:`harness.certify.smoothing`     -- the smoothed classifier, its certificate and abstentions.
- :mod:`harness.certify.certification` -- ``harness certify``: sharded, resumable certification runs.
"""
