"""The built-in kinds of threat model, registered here without importing torch (each builder is named by its path
and imported when a run builds its set): ``lp``, the norm ball (:mod:`harness.threats.lp`), and ``lowfreq``, an ℓ2
ball inside a band of low spatial frequencies (:mod:`harness.threats.lowfreq`). A new kind is one file like
those and one :func:`harness.api.threatspec.register_threat` call; a package registers its kinds through the
``harness.threats`` entry point group, as this folder does."""
from harness.api.schema import Rule
from harness.api.threatspec import ThreatParam, register_threat

DEFAULT_BAND = 8  # of 32 on CIFAR-10: 8 x 8 of the 32 x 32 DCT frequencies per channel (1/16 of the dimensions)

register_threat("lp", "harness.threats.lp:norm_ball", prose="{norm} ball, ε = {eps}")
register_threat(
    "lowfreq", "harness.threats.lowfreq:low_frequency",
    norms=("L2",),  # an ℓ2 ball inside the band: its size compares with ℓ2 attacks
    params=(ThreatParam("band", int, DEFAULT_BAND, Rule(low=1),
                        "the DCT band: perturbations in the frequencies max(u, v) < band of each channel"),),
    battery="lowfreq",  # presets/lowfreq.toml
    prose="low-frequency band (DCT frequencies max(u, v) < {band} per channel), {norm} ε = {eps}",
)
