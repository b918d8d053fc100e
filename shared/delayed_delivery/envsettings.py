"""Settings from the environment: one reader for every settings object, its errors naming the variable and value.

A settings class is a frozen dataclass whose fields are read from ``DELAYED_DELIVERY_<FIELD>`` (the field name in
upper case). ``bool`` fields take 1/0, true/false, yes/no or on/off; ``int``, ``float`` and ``str`` fields their
text; a field with ``parse`` in its metadata (``field(metadata={"parse": fn})``) is read by ``fn``, which raises
``ValueError`` on a bad value. A variable that is set but blank counts as unset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from .errors import ConfigurationError
from .validation import is_number, is_whole

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "ENV_PREFIX",
    "EnvSettings",
    "check_numbers",
    "env_name",
    "env_value",
    "flag",
    "markdown_reference",
    "read_settings",
    "reference",
    "setting_label",
]

#: Environment variables are ``ENV_PREFIX`` + the upper-cased field name.
ENV_PREFIX = "DELAYED_DELIVERY_"

T = TypeVar("T")
S = TypeVar("S", bound="DataclassInstance")

_SWITCH = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def flag(raw: str) -> bool:
    """``raw`` as a switch: 1/true/yes/on or 0/false/no/off, in any letter case."""
    try:
        return _SWITCH[raw.lower()]
    except KeyError:
        raise ValueError(raw) from None


_KINDS: dict[str, Callable[[str], Any]] = {"bool": flag, "int": int, "float": float, "str": str}
_WHAT: dict[Callable[[str], Any], str] = {
    flag: "a switch (true/false, 1/0, yes/no, on/off)",
    int: "a whole number",
    float: "a number",
}


def env_name(setting: str, prefix: str = ENV_PREFIX) -> str:
    """The variable a setting is read from: ``batch_size`` -> ``DELAYED_DELIVERY_BATCH_SIZE``."""
    return prefix + setting.upper()


def setting_label(setting: str, prefix: str = ENV_PREFIX) -> str:
    """How errors name a setting, so the variable is found too: ``batch_size (DELAYED_DELIVERY_BATCH_SIZE)``."""
    return f"{setting} ({env_name(setting, prefix)})"


def env_value(env: Mapping[str, str], name: str, kind: Callable[[str], T], default: T, *, what: str | None = None) -> T:
    """``env[name]`` read by ``kind`` (``int``, ``float``, ``str``, ``flag``...); ``default`` when unset or blank.

    A value ``kind`` refuses is a ``ConfigurationError``: ``NAME='value' is not <what>`` (``what``: what it must be).
    """
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ConfigurationError:
        raise  # a parser that says itself what is wrong (e.g. which entry of a JSON value)
    except ValueError:
        raise ConfigurationError(f"{name}={raw[:80]!r} is not {what or _WHAT.get(kind, 'valid')}") from None


def read_settings(cls: type[S], env: Mapping[str, str], prefix: str = ENV_PREFIX) -> S:
    """``cls`` with each field set in ``env`` as ``<prefix><FIELD>`` and its default otherwise (module docstring)."""
    values: dict[str, Any] = {}
    unset = object()
    for f in fields(cls):
        kind = f.metadata.get("parse") or _KINDS[str(f.type)]
        value = env_value(env, env_name(f.name, prefix), kind, unset)
        if value is not unset:
            values[f.name] = value
    return cls(**values)


def check_numbers(settings: DataclassInstance, prefix: str = ENV_PREFIX) -> None:
    """Every ``int`` field is a whole number and every ``float`` field a number, none negative (NaN is not one)."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.type == "int" and not is_whole(value):
            raise ConfigurationError(
                f"{setting_label(f.name, prefix)} must be a whole number of at least 0, got {value!r}"
            )
        if f.type == "float" and not is_number(value):
            raise ConfigurationError(f"{setting_label(f.name, prefix)} must be a number of at least 0, got {value!r}")


def reference(
    cls: type[DataclassInstance], docs: Mapping[str, str], prefix: str = ENV_PREFIX
) -> Iterator[tuple[str, str, str, str]]:
    """Rows of (field, environment variable, default, meaning) for documentation; ``docs`` has each field's meaning."""
    defaults = cls()
    for f in fields(cls):
        default = getattr(defaults, f.name)
        shown = repr(default.value) if isinstance(default, Enum) else repr(default)
        yield f.name, env_name(f.name, prefix), shown, docs[f.name]


def markdown_reference(rows: Iterator[tuple[str, str, str, str]]) -> str:
    """``reference`` rows as a Markdown table (the README embeds them; a test checks it)."""
    lines = ["| setting | environment variable | default | meaning |", "|---|---|---|---|"]
    lines += [f"| {name} | `{env}` | `{default}` | {doc} |" for name, env, default, doc in rows]
    return "\n".join(lines)


class EnvSettings:
    """The shape every settings dataclass shares: ``with_``, ``from_env``, ``reference``, ``markdown_reference``.

    A subclass is a frozen dataclass with ``DOCS``, each field's meaning for the configuration reference.
    """

    __slots__ = ()
    DOCS: ClassVar[Mapping[str, str]] = {}
    if TYPE_CHECKING:
        __dataclass_fields__: ClassVar[dict[str, Any]]

    def with_(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied (validated)."""
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str], prefix: str = ENV_PREFIX) -> Self:
        """Build settings from ``env`` (e.g. ``os.environ``), reading ``<prefix><FIELD>`` names."""
        return read_settings(cls, env, prefix)

    @classmethod
    def reference(cls) -> Iterator[tuple[str, str, str, str]]:
        """Rows of (field, environment variable, default, description) for documentation."""
        return reference(cls, cls.DOCS)

    @classmethod
    def markdown_reference(cls) -> str:
        """The settings as a Markdown table (embedded in the README; a test checks it)."""
        return markdown_reference(cls.reference())
