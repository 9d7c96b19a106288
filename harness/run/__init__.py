"""Running an evaluation: the runner, its executors, one stage of the cascade, and the verdict.

- :mod:`harness.run.runner`       -- ``run(cfg)``: the clean stage, the battery, escalation, the verdict.
- :mod:`harness.run.executors`    -- serial, process-pool and Ray execution of shards.
- :mod:`harness.run.stage`        -- one attack on one shard, its outcome and records.
- :mod:`harness.run.verdict`      -- the final verdict from fresh instances of the defense.
- :mod:`harness.run._placement`    -- the defense made ready: copy, first-batch checks, device.
- :mod:`harness.run.estimate`     -- the cost of a run, from a timed sample.
- :mod:`harness.run._acceleration` -- device, channels-last, ``torch.compile``.
"""
