"""The data source a run reads (:func:`open_data`), opened from its configuration with the preprocessing resolved."""
from __future__ import annotations

import dataclasses

from harness.config.run_config import RunConfig
from harness.sources.datasets import DataSource, open_source
from harness.sources.spec import parse_dataset, resolve_preprocess


def with_preprocessing(cfg: RunConfig) -> RunConfig:
    """``cfg`` with its preprocessing fields resolved (the source's default when neither ``resize`` nor ``crop`` is
    given: 256 and 224 for imagenet), so that it enters the run id and the stored config; a new config."""
    pre = resolve_preprocess(parse_dataset(cfg.dataset), cfg.resize, cfg.crop, cfg.interpolation)
    return dataclasses.replace(cfg, resize=pre.resize, crop=pre.crop,
                               interpolation=None if pre.identity else pre.interpolation)


def open_data(cfg: RunConfig) -> DataSource:
    """The run's data source, with the preprocessing ``cfg`` resolves to (:func:`preprocessing`)."""
    pre = resolve_preprocess(parse_dataset(cfg.dataset), cfg.resize, cfg.crop, cfg.interpolation)
    return open_source(cfg.dataset, cfg.data_root, cfg.download, subset=cfg.subset, preprocess=pre)
