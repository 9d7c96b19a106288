"""``hf:NAME[:SPLIT]``: a Hugging Face ``datasets`` dataset (the optional extra ``robustness-harness[hf]``), a folder
written by ``Dataset.save_to_disk`` or a hub name (downloaded by ``datasets`` into its own cache), split ``test``
unless named. Images are decoded per batch (``datasets`` reads rows from its Arrow files on demand); the image
column is the first of type ``Image`` (else ``image`` or ``img``), the label column the first ``ClassLabel`` (else
``label`` or ``labels``)."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from harness.errors import DataError, MissingInputError, UsageError
from harness.sources import preprocess as prep
from harness.sources.spec import Preprocess


@dataclass
class HubSource:
    """Rows of a ``datasets.Dataset`` with their labels; images decoded on demand."""

    name: str
    source: str
    dataset: Any  # datasets.Dataset
    image_column: str
    y: np.ndarray
    class_names: list[str] | None
    preprocess: Preprocess

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def labels(self) -> np.ndarray:
        return self.y

    @property
    def num_classes(self) -> int:
        return len(self.class_names) if self.class_names else int(self.y.max()) + 1

    @property
    def classes_fixed(self) -> bool:
        return self.class_names is not None

    def _pixels(self, value: Any, row: int) -> np.ndarray:
        image = value if isinstance(value, Image.Image) else Image.fromarray(np.asarray(value, dtype=np.uint8))
        return prep.apply_pil(image.convert("RGB"), self.preprocess, f"row {row}")

    def get(self, indices: Sequence[int] | np.ndarray, device: str | torch.device = "cpu") -> tuple[Tensor, Tensor]:
        idx = [int(i) for i in indices]
        values = self.dataset.select(idx)[self.image_column]
        x = prep.stack([self._pixels(v, i) for v, i in zip(values, idx)], [f"row {i}" for i in idx])
        return x.to(device), torch.from_numpy(self.y[idx]).to(device)

    def fingerprint(self, indices: Sequence[int]) -> str:
        """Hash of the dataset's Arrow files (names and sizes), the selected rows' pixels and labels, and the
        preprocessing."""
        files = [(Path(f["filename"]).name, os.path.getsize(f["filename"])) for f in self.dataset.cache_files]
        digest = hashlib.sha256(json.dumps({"files": files, "rows": len(self), "classes": self.class_names}).encode())
        idx = [int(i) for i in indices]
        for start in range(0, len(idx), 256):
            x, y = self.get(idx[start:start + 256])
            digest.update(x.mul(255).round().to(torch.uint8).numpy().tobytes() + y.numpy().tobytes())
        digest.update(self.preprocess.describe().encode())
        return digest.hexdigest()

    def describe(self) -> dict[str, Any]:
        return {"kind": "hf", "source": self.source, "images": len(self), "num_classes": self.num_classes,
                "classes": self.class_names, "preprocessing": self.preprocess.describe()}


def _columns(features: Any) -> tuple[str, str, list[str] | None]:
    import datasets

    names = list(features)
    image = next((c for c in names if isinstance(features[c], datasets.Image)), None) or \
        next((c for c in ("image", "img") if c in names), None)
    label = next((c for c in names if isinstance(features[c], datasets.ClassLabel)), None) or \
        next((c for c in ("label", "labels") if c in names), None)
    if image is None or label is None:
        raise DataError(f"the dataset has no {'image' if image is None else 'label'} column (it has: {', '.join(names)}); "
                        "expected an Image (or 'image'/'img') column and a ClassLabel (or 'label'/'labels') column")
    classes = features[label].names if isinstance(features[label], datasets.ClassLabel) else None
    return image, label, classes


def open_hf(name: str, target: str, split: str, pre: Preprocess) -> HubSource:
    """The ``split`` of the dataset saved at folder ``target``, else of the hub dataset ``target``."""
    try:
        import datasets
    except ImportError:
        raise UsageError(f"--dataset {name} needs the Hugging Face datasets package: pip install "
                         "'robustness-harness[hf]'") from None
    path = Path(target).expanduser()
    try:
        loaded = datasets.load_from_disk(str(path)) if path.is_dir() else datasets.load_dataset(target, split=split)
    except (FileNotFoundError, ValueError, ConnectionError) as exc:
        raise MissingInputError(f"--dataset {name}: cannot load {target!r} ({type(exc).__name__}: {exc})") from exc
    except IndexError as exc:  # datasets cannot read back a dataset saved with no rows
        raise DataError(f"--dataset {name}: {target!r} holds no rows, so no labels (datasets: {type(exc).__name__}: "
                        f"{exc}); accepted: a dataset with images and class-index labels") from exc
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise UsageError(f"--dataset {name}: no split {split!r}; the dataset has {', '.join(loaded)}")
        loaded = loaded[split]
    image, label, classes = _columns(loaded.features)
    y = np.asarray(loaded[label], dtype=np.int64)
    if y.size == 0 or y.min() < 0 or (classes is not None and y.max() >= len(classes)):
        raise DataError(f"--dataset {name}: labels must be class indices from 0"
                        + (f" to {len(classes) - 1}" if classes else "") + (", found none" if y.size == 0 else ""))
    return HubSource(name, str(path) if path.is_dir() else target, loaded, image, y, classes, pre)
