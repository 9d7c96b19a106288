"""The data source a run reads (:func:`open_data`), opened from its configuration with the preprocessing resolved."""
from __future__ import annotations

from harness.api.config import RunConfig
from harness.sources.datasets import DataSource, open_source
from harness.sources.spec import parse_dataset, resolve_preprocess


def open_data(cfg: RunConfig) -> DataSource:
    """The run's data source; its preprocessing is resolved into ``cfg`` (the source's default when neither
    ``resize`` nor ``crop`` is given: 256 and 224 for imagenet), so it enters the run id and the stored config."""
    pre = resolve_preprocess(parse_dataset(cfg.dataset), cfg.resize, cfg.crop, cfg.interpolation)
    cfg.resize, cfg.crop = pre.resize, pre.crop
    cfg.interpolation = None if pre.identity else pre.interpolation
    return open_source(cfg.dataset, cfg.data_root, cfg.download, subset=cfg.subset, preprocess=pre)
