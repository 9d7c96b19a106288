"""The run store: the run-directory format and everything that keeps it honest.

- :mod:`harness.store.rundir`      -- the versioned run-directory format: config, provenance, shards.
- :mod:`harness.store.status`      -- how complete a run is, and what it still needs.
- :mod:`harness.store.fingerprint` -- what makes two runs the same experiment (code, weights, data).
- :mod:`harness.store._locks`       -- file locks for shards and run metadata.
- :mod:`harness.store._machine`     -- hardware and load average recorded with timings.
"""
