"""The five plugin hooks, in register-callback style.

Each hook receives `register(name, factory)`; a plugin calls it once per thing it provides.
A factory takes keyword configuration and returns an object implementing the matching
interface in `dllmbench.interfaces`.
"""

from __future__ import annotations

from pluggy import HookimplMarker, HookspecMarker

hookspec = HookspecMarker("dllmbench")
hookimpl = HookimplMarker("dllmbench")


@hookspec
def dllmbench_register_backbones(register):
    """Call register(name, factory) once per Backbone this plugin provides."""


@hookspec
def dllmbench_register_scorers(register):
    """Call register(name, factory) once per Scorer this plugin provides."""


@hookspec
def dllmbench_register_strategies(register):
    """Call register(name, factory) once per SearchStrategy this plugin provides."""


@hookspec
def dllmbench_register_selectors(register):
    """Call register(name, factory) once per Selector this plugin provides."""


@hookspec
def dllmbench_register_tasks(register):
    """Call register(name, factory) once per Task this plugin provides."""
