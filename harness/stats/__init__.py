"""Statistics, without torch: intervals, paired tests, planning, sequential tests, scoring.

- :mod:`harness.stats.intervals`  -- Wilson, Clopper-Pearson and bootstrap intervals.
- :mod:`harness.stats.paired`     -- paired comparisons of two defenses on the same samples.
- :mod:`harness.stats.planning`   -- samples needed for a half-width or a margin.
- :mod:`harness.stats.sequential` -- confidence sequences.
- :mod:`harness.stats.stopping`   -- sequential stopping rules of a run.
- :mod:`harness.stats.scoring`    -- a sample's score under a stochastic criterion; the worst case.
- :mod:`harness.stats.stochastic` -- tables of a stochastic defense under each criterion.
- :mod:`harness.stats.subsets`    -- per-subset accuracies.
"""
