"""Forwards nobody is charged for: a model run by plugin code instead of through `ops`.

The engine computes every forward a run is charged for, between the moments strategies and
selectors run. While an engine runs, a process-wide forward hook counts every torch module
call made while plugin code runs (a strategy's `search` between two requests, a selector's
`select`), every call made on another thread (a rollout started in the background) and every
call made on the engine's thread outside the engine's own forwards (code of a value a plugin
handed the engine, run as the engine reads it: a request's steps, a pool's info): a
strategy that found the backbone object (through `gc`, say) and ran it itself, or a copy of
its weights, is caught at the next check and the run refuses, naming it.

The hook costs one Python call per module call; it is removed when the engine's run ends.
Each round also checks that no hook was added to (or removed from) the run's models or torch's
global hooks since the run began: a hook a strategy hangs on the backbone (found through `gc`)
runs inside the engine's own forward, where no plugin code is being watched.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn.modules import module as _torch_module
from torch.nn.modules.module import register_module_forward_pre_hook

from dllmbench.core.errors import PluginViolation


class ComputeWatch:
    """Counts module forwards made by plugin code, or away from the engine's thread."""

    def __init__(self) -> None:
        self._thread = threading.get_ident()
        self._plugin = False
        self.calls = 0  # module calls by plugin code, since the last `take`
        self.elsewhere = 0  # module calls on other threads
        self._computing = False  # the engine's own forward runs
        self.unowned = 0  # calls on this thread outside plugin code and the engine's forwards
        self._modules: list[torch.nn.Module] = []  # the run's models, whose hooks stay as they were
        self._hooks: tuple = ()

    def _hook(self, module: Any, args: Any) -> None:
        if threading.get_ident() != self._thread:
            self.elsewhere += 1
        elif self._plugin:
            self.calls += 1
        elif not self._computing:
            self.unowned += 1

    @contextmanager
    def watching(self, models: tuple[Any, ...] = ()) -> Iterator[ComputeWatch]:
        """Count while the engine runs (on this thread); `models` (the backbone, the scorers):
        objects whose torch modules must keep the hooks they have now."""
        self._thread = threading.get_ident()
        handle = register_module_forward_pre_hook(self._hook)
        self._modules = list(dict.fromkeys(m for obj in models for m in _modules_of(obj)))
        self._hooks = self._hook_state()
        try:
            yield self
        finally:
            handle.remove()

    @contextmanager
    def plugin(self) -> Iterator[None]:
        """Plugin code runs: any module forward now is one it made itself."""
        self._plugin = True
        try:
            yield
        finally:
            self._plugin = False

    @contextmanager
    def computing(self) -> Iterator[None]:
        """The engine's own forward runs (the backbone's step, a scorer's scores): the module
        calls now are the ones the ledger charges."""
        self._computing = True
        try:
            yield
        finally:
            self._computing = False

    def check(self, kind: str, name: str, distribution: str | None) -> None:
        """Refuse the run if the plugin just run (`kind` `name`) ran a model itself."""
        calls, self.calls = self.calls, 0
        if calls:
            what = (
                f"its {kind} ran a model itself ({calls} module forwards outside ops, "
                "charged to no one); every forward must go through ops"
            )
            raise PluginViolation(name, distribution, what)

    def _hook_state(self) -> tuple:
        glob = tuple(
            tuple(getattr(_torch_module, name, {}))
            for name in (
                "_global_forward_pre_hooks",
                "_global_forward_hooks",
                "_global_forward_hooks_always_called",
                "_global_backward_pre_hooks",
                "_global_backward_hooks",
            )
        )
        own = tuple(
            (tuple(m._forward_pre_hooks), tuple(m._forward_hooks), tuple(m._backward_hooks))
            for m in self._modules
        )
        return glob, own

    def check_threads(self) -> None:
        """Refuse the run if a model ran on another thread while the engine ran, or a hook was
        hung on (or taken off) a model or torch's global hooks: a hook runs code of its own
        inside the engine's forward, unwatched (another forward, say)."""
        if self._hook_state() != self._hooks:
            raise PluginViolation(
                "unknown",
                None,
                "a hook was added to or removed from a model (or torch's global module hooks) "
                "during the run: code run inside the engine's forwards, charged to no one; "
                "every forward must go through ops",
            )
        if self.unowned:
            raise PluginViolation(
                "unknown",
                None,
                f"a model ran on the engine's thread outside its forwards ({self.unowned} module "
                "forwards, charged to no one: code of a value a plugin handed the engine, run "
                "as the engine read it); every forward must go through ops",
            )
        if self.elsewhere:
            raise PluginViolation(
                "unknown",
                None,
                f"a model ran on another thread during the run ({self.elsewhere} module "
                "forwards outside ops, charged to no one); every forward must go through ops",
            )


def _modules_of(obj: Any) -> Iterator[torch.nn.Module]:
    """The torch modules of a backbone or scorer: itself when it is one, else those its
    attributes hold (one level down: `backbone.transformer`), with all their submodules."""
    if isinstance(obj, torch.nn.Module):
        yield from obj.modules()
        return
    for value in list(getattr(obj, "__dict__", {}).values()):
        if isinstance(value, torch.nn.Module):
            yield from value.modules()


def model_body(backbone: Any) -> Any:
    """The module a forward of the backbone's transformer runs once per row: the body under
    the LM head when it has one, else the transformer; None for a backbone that is not a
    transformer. The body is a transformers model's `base_model` (`transformer.model` of
    Qwen2, Llama, Qwen3; `transformer.bert` of a BertForMaskedLM), else `transformer.model`:
    a backbone that runs the body without its head (its own head at the masked positions)
    runs it all the same."""
    transformer = getattr(backbone, "transformer", None)
    if not isinstance(transformer, torch.nn.Module):
        return None
    for body in (getattr(transformer, "base_model", None), getattr(transformer, "model", None)):
        if isinstance(body, torch.nn.Module) and body is not transformer:
            return body
    return transformer


def _rows_of(args: Any, kwargs: dict[str, Any]) -> int:
    """The rows of a forward: the first dimension of its first tensor input."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return int(value.shape[0]) if value.dim() else 1
    return 1


class ModelRows:
    """Rows the backbone's model computed while a scorer scored.

    A scorer may share the backbone's weights (the reward scorers and `self` read each row it
    scores through them once); one that runs the model over more rows than it was asked to
    score (a rollout through `denoise_step` or `logits`) computes forwards that one scoring
    pass per row does not pay for, and the run refuses it."""

    def __init__(self, body: Any) -> None:
        self.body = body
        self.rows = 0
        self._on = False

    def _hook(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if self._on and threading.get_ident() == self._thread:
            self.rows += _rows_of(args, kwargs)

    @contextmanager
    def watching(self) -> Iterator[ModelRows]:
        """Hook the backbone's model while the engine runs (nothing without a model)."""
        self._thread = threading.get_ident()
        if self.body is None:
            yield self
            return
        handle = self.body.register_forward_pre_hook(self._hook, with_kwargs=True)
        try:
            yield self
        finally:
            handle.remove()

    @contextmanager
    def counting(self) -> Iterator[ModelRows]:
        """Count the rows the model computes inside this block (from 0)."""
        self.rows, self._on = 0, True
        try:
            yield self
        finally:
            self._on = False
