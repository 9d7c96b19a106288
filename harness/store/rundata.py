"""What a run directory's JSON files hold beside the records, as types: a shard's side data
(``records/shard-NNNNN.json``: :class:`ShardSide`), the provenance (``provenance.json``: :class:`Provenance`) and the
entries the run adds to it. :mod:`harness.store.rundir` reads both through :func:`checked`, so the engine works on
typed data and a file of another shape is refused at the store's edge, naming the file and the key.

The shapes are the files' as written since run format 1; keys a file may lack (older runs, runs without a verifier,
runs that never stopped early) are optional.
"""
import functools
import json
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Hashable, TypeVar, Union, cast, get_args, get_origin, get_type_hints

from typing_extensions import NotRequired, Required, TypedDict

from harness import atomic
from harness.api.flags import FlagRecord
from harness.errors import UsageError
from harness.jsontypes import JSONObject, JSONValue

if TYPE_CHECKING:
    from torch import Tensor

Shape = TypeVar("Shape")


class RunFormatError(UsageError):
    """A run directory's file is missing, unreadable, or of another format version."""


# -- a shard's side data --------------------------------------------------------------------------
class RungSummary(TypedDict, total=False):
    """One rung of a stage in rungs (``harness.run.rungs``): the iterations reached, the samples it attacked and
    still robust after it, the passes spent per attacked sample, and the samples the plateau rule parked."""
    iterations: Required[int]
    attempted: Required[int]
    robust_after: Required[int]
    passes: Required[dict[str, float]]
    stopped: int
    probed: int


class ProbeInfo(TypedDict, total=False):
    """A probed stage on one shard (``harness.run.probe``): the survivors it was drawn from, the probe's size, its
    members on this shard and, once decided, how many it broke, whether the stage was extended and, if not, the
    upper confidence bound on the breakable share."""
    survivors: Required[int]
    probed: Required[int]
    members: Required[int]
    broken: int
    extended: bool
    bound: float


PerSample = dict[str, list[JSONValue]]  # "index" (dataset indices) and the attack's per-sample extras, aligned


class StageExtras(TypedDict, total=False):
    """What a stage's side data holds besides its counts (``harness.run.schedule.stage_extras``)."""
    acc_trace: list[float]
    passes: dict[str, float]
    per_sample: PerSample
    eot_draws: float


class StageParts(TypedDict, total=False):
    """How a stage ran on a shard when it ran in parts: its rungs, its probe."""
    rungs: list[RungSummary]
    probe: ProbeInfo


class AttackTally(StageExtras, StageParts, total=False):
    """One stage of one shard: samples attempted and robust after it, why it was skipped, what it measured
    (:class:`StageExtras`) and how it ran (:class:`StageParts`)."""
    attempted: Required[int]
    robust_after: Required[int]
    skipped: str


class ShardSide(TypedDict):
    """A shard's side data: its stages in order, each stage's tally, the shard's flags, and the gradient mode found
    dead on it (mode, why) when one was."""
    stages: list[str]
    attacks: dict[str, AttackTally]
    diagnostics: list[FlagRecord]
    dead: NotRequired[list[str]]


def new_side() -> ShardSide:
    """The side data of a shard before its clean stage."""
    return {"stages": ["clean"], "attacks": {}, "diagnostics": []}


class KeptInputs(TypedDict):
    """What ``adversarials/shard-NNNNN.pt`` holds (``harness.run.kept``): the shard's dataset indices, its clean
    images, each stage's evaluated inputs and, for a defense with a purifier, one draw of the purifier's output on each
    (``clean``: on the clean images). Files written before the clean images were kept lack ``x``."""
    index: "Tensor"
    x: NotRequired["Tensor"]
    x_adv: dict[str, "Tensor"]
    purified: NotRequired[dict[str, "Tensor"]]


class RunFlag(TypedDict):
    """A run-level flag (``diagnostics.json``): a code on one attack, merged over the shards that raised it
    (``harness.diagnostics.merge``), with the escalations that acted on it."""
    code: str
    attack: str
    message: str
    remedy: str
    value: JSONValue
    shards: list[int]
    escalated: list[str]


# -- provenance -------------------------------------------------------------------------------------
class Hardware(TypedDict, total=False):
    """The machine a run started on (``harness.store._machine.hardware``)."""
    machine: Required[str]
    processor: Required[str]
    cpus: Required[int | None]
    threads: Required[int]
    device: Required[str]
    gpu: str


class Session(Hardware, total=False):
    """One start of a run (a resume, or each ``--shard-slice`` job)."""
    started: str
    git_commit: str | None
    git_dirty: bool | None
    load_average: float | None
    shards_stored: int


# "from" is a keyword, so this one is declared by call
BatchSizeEntry = TypedDict("BatchSizeEntry", {"batch_size": Required[int], "from": Required[str], "error": str,
                                              "at": str}, total=False)
BatchSizeEntry.__doc__ = """A batch size the run went on with: the start's, or one it halved to (``harness.run._memory``)."""


class ForcedResume(TypedDict):
    """A resume with ``--force-resume`` of a run whose fingerprint changed."""
    at: str
    changed: list[str]
    previous: JSONObject | None


class SequentialStop(TypedDict):
    """Where a sequential (``--until``) run stopped: the run is its first ``shards`` shards."""
    rule: str | None
    against: str | None
    about: str
    population: int
    confidence: float
    shards: int
    samples: int
    met: bool
    state: JSONObject | None


class VerifierSummary(TypedDict, total=False):
    """Where the verdict ran and, in new processes, what their calls cost (``harness.run.verdict``)."""
    kind: str
    device: str
    calls: int
    seconds: float
    start_seconds: float
    peak_bytes_attacked_process: int
    peak_bytes_new_process: int
    batch_sizes: list[int]


class RunInfo(TypedDict, total=False):
    """What the run adds to its provenance when it opens its directory: device, defense, data and first-batch checks."""
    device: str
    defense: JSONObject
    data_source: str
    data: JSONObject
    preflight: JSONObject
    verdict: str
    verify_device: str
    hardware: Hardware


class Provenance(RunInfo, total=False):
    """``provenance.json``: the plan (indices, shard sizes), the fingerprint, the software and machine, one session per
    start, the batch sizes, when the run started and finished, and what the run recorded (a sequential stop, the
    verifier's cost)."""
    format_version: int
    run_id: str
    git_commit: str | None
    git_dirty: bool | None
    packages: dict[str, str | None]
    python: str
    platform: str
    torch: str
    cuda: str | None
    threads: int
    seed: int
    n_samples: int
    indices: list[int]
    shard_sizes: list[int]
    fingerprint: JSONObject
    forced_resumes: list[ForcedResume]
    sessions: list[Session]
    batch_sizes: list[BatchSizeEntry]
    started: str
    finished: str | None
    sequential: SequentialStop
    verifier: VerifierSummary


# -- writing and reading them ------------------------------------------------------------------------------
def json_text(obj: object, *, indent: int | None = 2) -> str:
    """``obj`` as JSON text: numpy and torch scalars and arrays by their values, anything else JSON has no value for
    by its text."""
    return json.dumps(obj, indent=indent, default=_json_default)


def write_json(path: Path, obj: object) -> None:
    """Write ``obj`` as the JSON file ``path`` (:func:`json_text`), atomically."""
    atomic.write_text(path, json_text(obj))


def _json_default(obj: Any) -> object:
    if hasattr(obj, "tolist"):  # numpy and torch arrays and scalars (a 0-d one gives its value)
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def read_json(path: Path) -> object:
    """A JSON file of the run directory (an object, or the list of flags of ``diagnostics.json``)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunFormatError(f"cannot read {str(path)!r}: {exc}") from exc


def checked(data: object, shape: type[Shape], source: str) -> Shape:
    """``data`` (as ``json.loads`` read it from ``source``) as the TypedDict ``shape``, after checking that it is a
    JSON object holding ``shape``'s required keys and that each key it holds has the declared kind (object, list,
    text, number, true/false or null; one level deep). A file of another shape raises :class:`RunFormatError`.

    Written here rather than with a validation library: the run directory's files are the harness's own, and a
    shallow check at the edge is all they need (pydantic or typeguard would be a dependency for it)."""
    if not isinstance(data, dict):
        raise RunFormatError(f"{source!r} must hold a JSON object, got {type(data).__name__}")
    required = cast(frozenset[str], getattr(shape, "__required_keys__", frozenset()))
    missing = sorted(required - data.keys())
    if missing:
        raise RunFormatError(f"{source!r} lacks {', '.join(map(repr, missing))}; rerun the run's command into another "
                             "--run-id or --out")
    for key, hint in _hints(cast(Hashable, shape)).items():
        if key in data and not _holds(data[key], hint):
            raise RunFormatError(f"{source!r}: {key!r} must be {_kind_text(hint)}, got {type(data[key]).__name__} "
                                 f"{data[key]!r:.60}")
    return cast(Shape, data)


@functools.lru_cache(maxsize=None)
def _hints(shape: Hashable) -> dict[str, Any]:
    """A shape's declared keys and types, resolved once per shape (the shapes are this module's classes)."""
    return get_type_hints(shape)


def _kinds(hint: Any) -> tuple[type, ...]:
    """The JSON kinds (Python types as ``json.loads`` returns them) a declared type allows."""
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        return tuple(k for arg in get_args(hint) for k in _kinds(arg))
    if origin is not None:
        return (origin,)
    if isinstance(hint, type) and issubclass(hint, dict):  # a TypedDict
        return (dict,)
    if hint is float:
        return (int, float)
    return (type(None),) if hint is None or hint is type(None) else (hint,) if isinstance(hint, type) else (object,)


def _holds(value: object, hint: Any) -> bool:
    kinds = _kinds(hint)
    if isinstance(value, bool) and bool not in kinds and object not in kinds:
        return False  # true/false is no number here
    return isinstance(value, kinds)


def _kind_text(hint: Any) -> str:
    names = {dict: "an object", list: "a list", str: "text", int: "a number", float: "a number", bool: "true or false",
             type(None): "null", object: "any value"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in _kinds(hint)))


__all__ = ["AttackTally", "BatchSizeEntry", "ForcedResume", "Hardware", "KeptInputs", "PerSample", "ProbeInfo", "Provenance",
           "RunFlag", "RunFormatError", "RunInfo", "RungSummary", "SequentialStop", "Session", "ShardSide", "StageExtras", "StageParts",
           "VerifierSummary", "checked", "json_text", "new_side", "read_json", "write_json"]
