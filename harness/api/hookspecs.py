"""The plugin hooks, in register-callback style.

Each hook receives a `register` callback; a plugin calls it once per thing it provides. For
the five plugin kinds that is `register(name, factory)`: a factory takes keyword
configuration and returns an object implementing the matching Protocol in
`dllmbench.interfaces` (checked when the registry builds it). Method families are registered
as `register(name, spec=..., label=...)`.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from pluggy import HookimplMarker, HookspecMarker

from dllmbench.api.interfaces import Backbone, Scorer, SearchStrategy, Selector, Task

hookspec = HookspecMarker("dllmbench")
hookimpl = HookimplMarker("dllmbench")

P_co = TypeVar("P_co", covariant=True)


class Factory(Protocol[P_co]):
    """Keyword configuration (and, if it asks by name, the run's `backbone`) → a plugin."""

    def __call__(self, *args: Any, **config: Any) -> P_co: ...


P = TypeVar("P")


class Register(Protocol[P]):
    """The callback of a kind's hook: `register(name, factory)`."""

    def __call__(self, name: str, factory: Factory[P], /) -> None: ...


class RegisterFamily(Protocol):
    """The callback of the method-family hook.

    `spec` is a method spec whose free size is `*` (the planner chooses it) and where `{half}`
    stands for T // 2; `label` is the leaderboard's short name, formatted with the strategy's
    configuration, e.g. "Beam K={k}".
    """

    def __call__(self, name: str, *, spec: str, label: str) -> None: ...


@hookspec
def dllmbench_register_backbones(register: Register[Backbone]) -> None:
    """Call register(name, factory) once per Backbone this plugin provides."""


@hookspec
def dllmbench_register_scorers(register: Register[Scorer]) -> None:
    """Call register(name, factory) once per Scorer this plugin provides."""


@hookspec
def dllmbench_register_strategies(register: Register[SearchStrategy]) -> None:
    """Call register(name, factory) once per SearchStrategy this plugin provides."""


@hookspec
def dllmbench_register_selectors(register: Register[Selector]) -> None:
    """Call register(name, factory) once per Selector this plugin provides."""


@hookspec
def dllmbench_register_tasks(register: Register[Task]) -> None:
    """Call register(name, factory) once per Task this plugin provides."""


@hookspec
def dllmbench_register_methods(register: RegisterFamily) -> None:
    """Call register(name, spec=..., label=...) once per method family this plugin provides."""
