"""A refusal is exactly one line: nothing the engine leaves behind (a strategy run it never
resumed) adds a warning to it. This module is itself a plugin (`registry_with`)."""

from __future__ import annotations

import gc
import warnings

from conftest import toy_argv

from dllmbench.api.hookspecs import hookimpl


class AsksTheImpossible:
    """One sample whose sampler settings the backbone refuses, after the other methods'
    strategy runs have started."""

    scorers = ()
    prefix_field = None

    def __init__(self, **config):
        pass

    def cost(self, total_steps: int) -> dict[str, int]:
        return {"denoise": total_steps}

    def pool_size(self) -> int:
        return 1

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    async def search(self, problem, ops):
        rows = ops.start(problem, settings={"no_such_setting": 1})
        return ops.pool(await ops.denoise(rows))


@hookimpl
def dllmbench_register_strategies(register):
    register("asks_the_impossible", AsksTheImpossible)


def test_a_refusal_mid_run_is_one_line_and_leaves_no_coroutine_behind(tmp_path, cli, registry_with):
    registry_with(__name__)
    argv = [*toy_argv(6), "--methods", "majority,prm_guided,orm_rerank"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = cli(*argv, "--method", "asks_the_impossible+first", "--out", tmp_path / "r")
        gc.collect()
    assert result.code == 2
    lines = [line for line in result.err.splitlines() if "error" in line or "Warning" in line]
    assert len(lines) == 1 and "no_such_setting" in lines[0], result.err
    never_awaited = [w for w in caught if "never awaited" in str(w.message)]
    assert never_awaited == []
