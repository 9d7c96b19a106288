"""Running an evaluation, resolved once then executed: the run's plan, the runner, its executors, one shard's
cascade of stages, and the verdict.

- :mod:`harness.run.plan`         -- ``RunContext`` (a run resolved once), ``StagePlan`` (one entry), ``ShardBatch``.
- :mod:`harness.run.runner`       -- ``run(cfg)``: the clean stage, the battery, escalation, the verdict.
- :mod:`harness.run.executors`    -- local and Ray execution of shards, through the one shard protocol.
- :mod:`harness.run.cascade`      -- one shard's stages in order, its progress stored after each.
- :mod:`harness.run.stage`        -- one attack on one shard, its outcome and records.
- :mod:`harness.run.verdict`      -- the final verdict from fresh instances of the defense.
- :mod:`harness.run._placement`    -- the defense made ready: copy, first-batch checks, device; the run's context.
- :mod:`harness.run.estimate`     -- the cost of a run, from a timed sample.
- :mod:`harness.run._acceleration` -- device, channels-last, ``torch.compile``.
"""
