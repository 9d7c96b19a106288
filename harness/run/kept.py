"""What a run keeps of its inputs with ``--save-adversarials`` (one ``adversarials/shard-NNNNN.pt`` per shard): the
shard's clean images, every stage's evaluated inputs and, for a defense with a purifier, one seeded draw of the
purifier's output on each (so a report can show what the purifier made of the clean image and of the attack's).

The purifier's outputs cost one purifier pass per attacked sample and stage, paid only when the run keeps its
adversarials; they are drawn with a seed of their own (``SEED_GALLERY``) so a resumed shard (which keeps its batch
size) stores the same images.
"""
from __future__ import annotations

import torch
from torch import Tensor

from harness.api.defense import Defense
from harness.seeding import SEED_GALLERY, derive_seed, seeded
from harness.store.rundata import KeptInputs

CLEAN = "clean"  # the key of the purifier's output on the clean images


def _cpu(x: Tensor) -> Tensor:
    return x.detach().to("cpu", memory_format=torch.contiguous_format).float()


def purified(defense: Defense, x: Tensor, *, seed: int, batch_size: int) -> Tensor:
    """One seeded draw of ``defense``'s purifier on ``x`` (no gradients), in batches; on the CPU."""
    out = []
    with torch.no_grad(), seeded(seed, x.device):
        for i in range(0, len(x), max(1, batch_size)):
            out.append(_cpu(defense.purify(x[i:i + batch_size], "full")))
    return torch.cat(out) if out else _cpu(x)


class Kept:
    """The kept inputs of one shard, as stored (:class:`harness.store.rundata.KeptInputs`)."""

    def __init__(self, stored: KeptInputs, defense: Defense, *, run_seed: int, shard: int, batch_size: int) -> None:
        self.stored, self.defense, self.batch_size = stored, defense, batch_size
        self.run_seed, self.shard = run_seed, shard

    @classmethod
    def open(cls, stored: KeptInputs | None, indices: list[int], x: Tensor, defense: Defense, *, run_seed: int,
             shard: int, batch_size: int) -> Kept:
        """A shard's kept inputs: ``stored`` ones continued, else new ones holding the clean images ``x`` and the
        purifier's output on them (files written before the clean images were kept get them added)."""
        if stored is None:
            stored = {"index": torch.as_tensor(indices), "x_adv": {}, "purified": {}}
        kept = cls(stored, defense, run_seed=run_seed, shard=shard, batch_size=batch_size)
        stored.setdefault("x", _cpu(x))
        if defense.purifier is not None and not stored.setdefault("purified", {}):
            stored["purified"][CLEAN] = purified(defense, x, seed=kept._seed(0), batch_size=batch_size)
        return kept

    def _seed(self, stage: int) -> int:
        return derive_seed(self.run_seed, self.shard, stage, SEED_GALLERY)

    def stage(self, name: str, stage: int, x_adv: Tensor, changed: Tensor) -> None:
        """Keep stage ``name``'s evaluated inputs: ``x_adv`` for the rows ``changed`` (a boolean mask over the shard),
        the stored inputs (or the clean image) elsewhere; the purifier's output redrawn for the changed rows."""
        changed = changed.cpu()
        x = self.stored["x_adv"].get(name)
        x = self.stored["x"].clone() if x is None else x
        x[changed] = _cpu(x_adv)
        self.stored["x_adv"][name] = x
        purified_all = self.stored.setdefault("purified", {})
        if self.defense.purifier is None or CLEAN not in purified_all:
            return
        z = purified_all.get(name, purified_all[CLEAN]).clone()
        if bool(changed.any()):
            z[changed] = purified(self.defense, x[changed].to(x_adv.device), seed=self._seed(stage),
                                  batch_size=self.batch_size)
        purified_all[name] = z
