"""Registries for defenses, attacks and other named factories.

Modelled on timm's model registry: built-ins register themselves with a decorator,
third parties through a package entry point, and users can point at a factory in
their own file (``path/to/file.py:factory``) or module (``package.module:factory``)
without editing the harness.
"""
from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, TypeVar

from harness.api.factory_options import REQUIRED, options_of
from harness.api.schema import option_problems
from harness.errors import UsageError, did_you_mean, one_line, user_frame

T = TypeVar("T")
Factory = Callable[..., Any]


class RegistryError(UsageError, LookupError):
    """A name, plugin path or factory could not be resolved; the message says what is accepted."""


def spec_file(spec: str) -> Path | None:
    """The Python file a ``path/to/file.py:factory`` spec names (``~`` expanded, not resolved), or None for any other
    spec (a registered name, ``package.module:factory``): the one rule telling a file from a module."""
    target, sep, _ = spec.rpartition(":")
    if sep and (target.endswith(".py") or "/" in target or "\\" in target):
        return Path(target).expanduser()
    return None


def absolute_spec(spec: str) -> str:
    """``spec`` with the file it names made absolute (another process may not share this one's working directory);
    any other spec as it is."""
    path = spec_file(spec)
    return spec if path is None else f"{path.resolve()}:{spec.rpartition(':')[2]}"


def load_object(spec: str, *, kind: str = "object") -> Any:
    """Load ``path/to/file.py:name`` or ``package.module:name``.

    Raises :class:`RegistryError` naming the file or module and what was expected.
    """
    if ":" not in spec:
        raise RegistryError(f"{kind} spec {spec!r} is not of the form 'path/to/file.py:factory' or 'package.module:factory'")
    target, _, attr = spec.rpartition(":")
    if not attr.isidentifier():
        raise RegistryError(f"{kind} spec {spec!r}: {attr!r} after ':' is not a Python identifier")
    path = spec_file(spec)
    if path is not None:
        if not path.is_file():
            raise RegistryError(f"{kind} file {str(path)!r} does not exist (from spec {spec!r}); expected an existing Python file 'path/to/file.py:factory'")
        mod_name = f"_harness_plugin_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        if module_spec is None or module_spec.loader is None:
            raise RegistryError(f"{kind} file {str(path)!r} could not be loaded as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # surface the user's own error with the file and line named
            sys.modules.pop(mod_name, None)
            frame = user_frame(exc)
            where = f"{frame.filename}:{frame.lineno}" if frame is not None else str(path)
            raise RegistryError(f"importing {kind} file {str(path)!r} failed at {where}: "
                                f"{type(exc).__name__}: {one_line(exc)}") from exc
        where = f"file {str(path)!r}"
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise RegistryError(f"{kind} module {target!r} could not be imported: {exc}") from exc
        where = f"module {target!r}"
    if not hasattr(module, attr):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise RegistryError(f"{where} has no attribute {attr!r}; callables defined there: {', '.join(public) or '(none)'}")
    obj = getattr(module, attr)
    return obj


class Registry(Generic[T]):
    """A named collection of factories ``(**options) -> T``.

    ``group`` is the entry-point group scanned on first lookup: an entry point ``name = "module:factory"``
    adds one factory; one that names only a module (``builtin = "harness.attacks"``) is imported so its
    decorators register its factories. The built-ins are found this way too, so no module names them.
    ``validate`` checks what a factory returned and raises ``TypeError`` if wrong.
    """

    def __init__(self, kind: str, *, group: str | None = None,
                 validate: Callable[[Any, str], T] | None = None) -> None:
        self.kind = kind
        self.group = group
        self._validate = validate
        self._factories: dict[str, Factory] = {}
        self._loaded = False

    # -- registration ---------------------------------------------------
    def register(self, name: str) -> Callable[[Factory], Factory]:
        """Decorator: register ``factory`` under ``name``. A name collision raises."""
        def deco(factory: Factory) -> Factory:
            self.add(name, factory)
            return factory
        return deco

    def add(self, name: str, factory: Factory) -> None:
        if not callable(factory):
            raise TypeError(f"{self.kind} {name!r}: factory must be callable, got {type(factory).__name__}")
        existing = self._factories.get(name)
        if existing is not None and existing is not factory:
            raise RegistryError(f"{self.kind} name {name!r} is already registered (by {_describe(existing)}); choose another name")
        self._factories[name] = factory

    # -- discovery ------------------------------------------------------
    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        found = entry_points(group=self.group) if self.group else ()
        import_plugin_modules(found, self.kind)  # first: their decorators register under their own names
        for ep in found:
            if ep.attr is not None and ep.name not in self._factories:
                self._factories[ep.name] = _LazyEntryPoint(ep)

    def plugin_modules(self) -> list[str]:
        """The modules this registry's entry points name (not imported here): what another process imports to have
        the same factories at hand (the isolated verdict's server, ``harness.diagnostics.isolated``)."""
        return list(dict.fromkeys(ep.module for ep in entry_points(group=self.group))) if self.group else []

    def names(self, pattern: str = "*") -> list[str]:
        """Registered names matching a shell-style ``pattern``."""
        self._ensure_loaded()
        return sorted(n for n in self._factories if fnmatch.fnmatch(n, pattern))

    def get(self, spec: str) -> Factory:
        """Resolve a registered name, an entry point, or a ``file.py:factory`` / ``module:factory`` spec."""
        self._ensure_loaded()
        if spec in self._factories:
            factory = self._factories[spec]
            return factory.load() if isinstance(factory, _LazyEntryPoint) else factory
        if ":" in spec:
            obj = load_object(spec, kind=self.kind)
            if not callable(obj):
                raise RegistryError(f"{self.kind} factory {spec!r} is a {type(obj).__name__}, not callable; expected a function or class returning a {self.kind}")
            loaded: Factory = obj
            return loaded
        raise RegistryError(f"unknown {self.kind} {spec!r}{self.did_you_mean(spec)}; `harness list {self.kind}s` lists "
                            f"them all. A user factory can be given as 'path/to/file.py:factory' or "
                            f"'package.module:factory'.")

    def did_you_mean(self, spec: str) -> str:
        """`` (did you mean X, Y?)``: the registered names closest to ``spec`` (spelling, or containing it)."""
        return did_you_mean(spec, self.names(), containing=True)

    def create(self, spec: str, **options: Any) -> T:
        """Build the object named by ``spec`` with keyword ``options`` and validate it."""
        factory = self.get(spec)
        accepted = options_of(factory)
        if accepted is not None:  # only a mismatch of the options themselves; errors inside the factory propagate
            unknown = accepted.unknown(options)
            if unknown:
                raise RegistryError(f"{self.kind} {spec!r} {accepted.refusal(unknown)}")
            missing = [o.name for o in accepted.options if o.default is REQUIRED and o.name not in options]
            if missing:
                raise RegistryError(f"{self.kind} {spec!r} needs option(s) {', '.join(missing)}; accepted: "
                                    f"{', '.join(accepted.names)}")
        problems = option_problems(factory, options)  # a quoted "false" or a NaN is not a valid option value
        if problems:
            raise RegistryError(f"{self.kind} {spec!r}: option {'; option '.join(problems)}")
        obj = factory(**options)
        if self._validate is not None:
            return self._validate(obj, spec)
        built: T = obj
        return built

    def __contains__(self, name: str) -> bool:
        self._ensure_loaded()
        return name in self._factories


class _LazyEntryPoint:
    def __init__(self, ep: Any) -> None:
        self.ep = ep

    def load(self) -> Factory:
        try:
            factory: Factory = self.ep.load()
            return factory
        except Exception as exc:
            raise RegistryError(f"entry point {self.ep.name!r} ({self.ep.value}) failed to load: {exc}") from exc

    def __call__(self, **options: Any) -> Any:
        return self.load()(**options)


def import_plugin_modules(found: Iterable[EntryPoint], kind: str) -> None:
    """Import the modules the entry points ``found`` name without a factory (``name = "package.module"``): a
    plugin whose import registers what it holds. One that fails to import is a :class:`RegistryError` naming it."""
    for ep in found:
        if ep.attr is None:
            try:
                importlib.import_module(ep.module)
            except ImportError as exc:
                raise RegistryError(f"{kind} plugin module {ep.module!r} (entry point {ep.name!r} in group "
                                    f"{ep.group!r}) could not be imported: {exc}") from exc


def _describe(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
