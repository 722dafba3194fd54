"""What a strategy plugin can reach: never a problem's answer. This module is itself a plugin
(`registry_with`)."""

from __future__ import annotations

import dataclasses
import gc
import json
import sys
import threading

import pytest
import torch
from conftest import toy_argv

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import StepBatch
from dllmbench.api.ops import DenoiseRequest, Posted
from dllmbench.plugins.backbones.tiny import Tiny
from dllmbench.testing.doubles import ALPHABET, ToyBackbone

SEEN: list[object] = []


class PeeksAtTheAnswer:
    """Majority@2 that looks for the answer everywhere a strategy is handed the problem."""

    scorers = ()
    prefix_field = None

    def __init__(self, **config):
        pass

    def cost(self, total_steps: int) -> dict[str, int]:
        return {"denoise": 2 * total_steps}

    def pool_size(self) -> int:
        return 2

    def pool_scores(self) -> frozenset[str]:
        return frozenset()

    async def search(self, problem, ops):
        rows = ops.start(problem, copies=2)
        SEEN.extend([problem.gold, ops.problem.gold, rows.problem.gold])
        rows = await ops.denoise(rows)
        SEEN.append(rows.problem.gold)
        return ops.pool(rows)


HOOKS: list = []  # the hooks PrivateRollout hung, removed when its test ends


class PrivateRollout(PeeksAtTheAnswer):
    """Majority@2 that also finds the backbone through `gc` and runs it itself, in its own
    code (`where="here"`), on a thread of its own (`where="thread"`), in a forward hook it
    hangs on the backbone's model (`where="hook"`), which runs inside the engine's own forward,
    outside any plugin code, or in a value it hands the engine, run as the engine reads it: a
    request's steps (`where="steps"`), a sampler setting the backbone compares inside its forward
    (`where="setting"`), or its rows' owners, read while the engine serves the request
    (`where="owners"`)."""

    def __init__(self, where: str = "here"):
        self.where = where

    async def search(self, problem, ops):
        rows = ops.start(problem, copies=2)
        # every Tiny alive: a test process may hold others beside the run's
        backbones = [o for o in gc.get_objects() if type(o) is Tiny]
        ids = rows.tokens[:1]

        def rollout(backbone):
            with torch.no_grad():
                backbone.transformer(input_ids=ids.to(backbone.device))

        if self.where == "hook":
            for backbone in backbones:

                def hook(module, args, output, backbone=backbone, busy=[]):  # noqa: B006
                    if not busy:  # the hook's own forward calls it again
                        busy.append(True)
                        rollout(backbone)
                        busy.clear()

                HOOKS.append(backbone.transformer.register_forward_hook(hook))
        elif self.where == "steps":
            steps = RunsWhenRead(backbones[0], ids, (ops.T, ops.T))
            return ops.pool(ops._issue(await Posted(DenoiseRequest(rows, steps))))
        elif self.where == "setting":
            hot = RunsWhenCompared(0.5)
            hot.run = lambda: rollout(backbones[0])
            sly = dataclasses.replace(rows, settings=((("temperature", hot),),) * 2)
            done = await Posted(DenoiseRequest(sly, (ops.T, ops.T)))
            return ops.pool(ops._issue(dataclasses.replace(done, settings=rows.settings)))
        elif self.where == "owners":
            SlyOwners.run = lambda: rollout(backbones[0])
            sly = dataclasses.replace(rows, owners=SlyOwners(rows.owners))
            done = await Posted(DenoiseRequest(sly, (ops.T, ops.T)))
            return ops.pool(ops._issue(dataclasses.replace(done, owners=rows.owners)))
        elif self.where == "thread":
            worker = threading.Thread(target=rollout, args=(backbones[0],))
            worker.start()
            worker.join()
        else:
            rollout(backbones[0])
        return ops.pool(await ops.denoise(rows))


class RunsWhenRead(tuple):
    """A request's steps that run the backbone whenever they are iterated."""

    def __new__(cls, backbone, ids, steps):
        obj = super().__new__(cls, steps)
        obj.backbone, obj.ids = backbone, ids
        return obj

    def __iter__(self):
        with torch.no_grad():
            self.backbone.transformer(input_ids=self.ids.to(self.backbone.device))
        return super().__iter__()


class RunsWhenCompared(float):
    """A sampler setting that runs `run` when the sampler compares it inside the backbone's
    `denoise_step` (in the engine's own forward, where no plugin code is watched)."""

    run = None

    def _ran(self, other, compare):
        frame = sys._getframe()
        while frame is not None and frame.f_code.co_name != "denoise_step":
            frame = frame.f_back
        if frame is not None and self.run is not None:
            self.run()
        return compare(float(self), other)

    def __lt__(self, other):
        return self._ran(other, float.__lt__)

    def __gt__(self, other):
        return self._ran(other, float.__gt__)

    def __le__(self, other):
        return self._ran(other, float.__le__)

    def __ge__(self, other):
        return self._ran(other, float.__ge__)


class SlyOwners(tuple):
    """A request's owners, as given, that run `run` when one row's owners are read by index."""

    run = None

    def __getitem__(self, i):
        type(self).run()
        return super().__getitem__(i)


class ReOwns(PeeksAtTheAnswer):
    """Majority@n whose rows are charged to someone else: to nobody (`to="nobody"`), posted
    past ops (`to="posted"`), or, sharing a nested pool with a smaller method, to the larger
    one only (`to="larger"`: its rows out of start order, so the smaller one's candidates
    were paid for by the larger), or started beyond its pool (`to="overstart"`: 2n copies,
    those from n on no method's)."""

    @dataclasses.dataclass(frozen=True)
    class Config:
        n: int = 2
        to: str = "nobody"

    prefix_field = "n"

    def __init__(self, **config):
        self.config = self.Config(**config)

    def cost(self, total_steps: int) -> dict[str, int]:
        return {"denoise": self.config.n * total_steps}

    def pool_size(self) -> int:
        return self.config.n

    async def search(self, problem, ops):
        n, to = self.config.n, self.config.to
        rows = ops.start(problem, copies=2 * n if to == "overstart" else n)
        if to == "nobody":
            rows = dataclasses.replace(rows, owners=((),) * n)
        elif to == "posted":
            nobody = dataclasses.replace(rows, owners=((),) * n)
            done = await Posted(DenoiseRequest(nobody, (ops.T,) * n))
            return ops.pool(dataclasses.replace(done, owners=rows.owners))
        rows = await ops.denoise(rows)
        if to == "larger":
            rows = rows.take(list(range(n))[::-1])
        return ops.pool(rows)


class HashOrder(PeeksAtTheAnswer):
    """Majority@2 whose pool is ordered by `hash()` of a string: another order in another
    process."""

    async def search(self, problem, ops):
        rows = await ops.denoise(ops.start(problem, copies=2))
        order = sorted(range(2), key=lambda i: hash(f"{problem.id}/{i}"))
        return ops.pool(rows.take(order))


@hookimpl
def dllmbench_register_strategies(register):
    register("peeks_at_the_answer", PeeksAtTheAnswer)
    register("hash_order", HashOrder)
    register("private_rollout", PrivateRollout)
    register("re_owns", ReOwns)


class ForgesScores:
    """Writes a score of its own into every candidate (past the read-only dict) and picks the
    last candidate."""

    needs = ("orm",)
    ceiling = False

    def __init__(self, **config):
        pass

    def select(self, candidates, *, rng, labels=None):
        for c in candidates:
            dict.__setitem__(c.scores, "orm", 99.0)
            object.__setattr__(c, "answer", "forged")
        return len(candidates) - 1


@hookimpl
def dllmbench_register_selectors(register):
    register("forges_scores", ForgesScores)


class LookaheadScorer:
    """A process scorer sharing the backbone: it reads each row once through `logits`
    (`rollout=False`), or rolls each row out to its end with the backbone's own
    `denoise_step` and reads that (`rollout=True`): T forwards for one pass of score."""

    reads_partial = True

    @dataclasses.dataclass(frozen=True)
    class Config:
        rollout: bool = False

    def __init__(self, backbone=None, **config):
        self.config = self.Config(**config)
        self.backbone = backbone

    def score(self, batch):
        bb, out = self.backbone, []
        for row, plen, step in zip(batch.tokens, batch.prompt_lens, batch.steps, strict=True):
            if self.config.rollout:
                for t in range(step, batch.total_steps):
                    one = StepBatch([row], [plen], [t], [7], batch.total_steps)
                    row = bb.denoise_step(one)[0]
            ids, attn, _ = bb.pad([row])
            with torch.no_grad():
                out.append(float(bb.logits(ids.to(bb.device), attn.to(bb.device))[0, -1, 0]))
        return out


@hookimpl
def dllmbench_register_scorers(register):
    register("lookahead", LookaheadScorer)


class BertBodied(ToyBackbone):
    """The toy sampler behind a forward of a tiny random BertForMaskedLM: a transformers
    model whose body is `transformer.bert` (no `.model`), run without its wrapper, its head
    applied by the backbone, as a masked LM's backbone does."""

    def __init__(self, **config):
        from transformers import BertConfig, BertForMaskedLM

        super().__init__(**config)
        torch.manual_seed(0)
        shape = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
        bert = BertConfig(vocab_size=len(ALPHABET) + 2, intermediate_size=32, **shape)
        self.transformer = BertForMaskedLM(bert).eval()
        self.device = torch.device("cpu")
        self.stop_ids, self.eos_id = {len(ALPHABET)}, len(ALPHABET)

    def pad(self, rows):
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attn = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :], attn[i, width - len(r) :] = r, 1
        return ids, attn, [width - len(r) for r in rows]

    def logits(self, ids, attn):
        hidden = self.transformer.bert(input_ids=ids, attention_mask=attn).last_hidden_state
        return self.transformer.cls(hidden)

    def denoise_step(self, batch):
        ids, attn, _ = self.pad(batch.tokens)
        with torch.no_grad():
            self.logits(ids, attn)  # the forward a step runs; the toy sampler then commits
        return super().denoise_step(batch)


@hookimpl
def dllmbench_register_backbones(register):
    register("bert_bodied", BertBodied)


def test_a_strategy_never_sees_the_answer_and_its_answers_are_still_graded(
    tmp_path, cli, registry_with
):
    registry_with(__name__)
    SEEN.clear()
    argv = [
        *toy_argv(4),
        "--methods",
        "orm_rerank,prm_rerank",
        "--method",
        "peeks_at_the_answer+majority",
    ]
    result = cli(*argv, "--budget", 16, "--out", tmp_path / "r", "--json")
    assert result.code == 0, result.err
    assert len(SEEN) == 4 * 4 and all(gold is None for gold in SEEN)
    records = [json.loads(line) for line in (tmp_path / "r" / "samples.jsonl").open()]
    peeked = [r for r in records if r["method"].startswith("peeks")]
    assert len(peeked) == 4 and any(r["correct"] for r in records)
    assert all(isinstance(r["correct"], bool) for r in peeked)


def test_what_a_selector_does_to_its_candidates_never_reaches_the_record(
    tmp_path, cli, registry_with
):
    """The forging selector shares ORM Rerank@4's pool (the same rows, the same ORM scores):
    its records show the pool's true scores and answers, and only its choice is its own."""
    registry_with(__name__)
    argv = [*toy_argv(3), "--methods", "orm_rerank,prm_rerank"]
    argv += ["--method", "independent:n=4+forges_scores", "--budget", 36]
    result = cli(*argv, "--out", tmp_path / "r")
    assert result.code == 0, result.err
    records = [json.loads(line) for line in (tmp_path / "r" / "samples.jsonl").open()]
    honest = {r["problem"]: r for r in records if r["method"] == "ORM Rerank@4"}
    forged = [r for r in records if "Rerank" not in r["method"]]
    assert len(honest) == len(forged) == 3
    for r in forged:
        same = honest[r["problem"]]["candidates"]
        assert [c["scores"] for c in r["candidates"]] == [c["scores"] for c in same]
        assert all(c["scores"]["orm"] != 99.0 for c in r["candidates"])
        assert [c["answer"] for c in r["candidates"]] == [c["answer"] for c in same]
        assert r["selected"] == 3 and r["answer"] == same[3]["answer"] != "forged"


TINY = ["run", "--task", "arith", "--backbone", "tiny", "--steps", "8", "--gen-length", "32"]


@pytest.mark.parametrize(
    "where,needle",
    [
        (
            "here",
            "plugin 'private_rollout' (from module:test_plugin_reach) broke its contract: "
            "its search ran a model itself",
        ),
        ("thread", "a model ran on another thread during the run"),
        ("hook", "a hook was added to or removed from a model"),
        ("steps", "plugin 'private_rollout' (from module:test_plugin_reach) broke its contract"),
        ("setting", "rows whose setting 'temperature' is a RunsWhenCompared, not a plain value"),
        ("owners", "a model ran on the engine's thread outside its forwards"),
    ],
)
def test_a_strategy_that_runs_the_backbone_itself_stops_the_run(
    tmp_path, cli, registry_with, where, needle
):
    registry_with(__name__)
    argv = [*TINY, "--limit", 2, "--method", f"private_rollout:where={where}+majority"]
    try:
        result = cli(*argv, "--budget", 16, "--out", tmp_path / "r")
    finally:
        while HOOKS:
            HOOKS.pop().remove()
    assert result.code == 3, result.err
    lines = [line for line in result.err.splitlines() if "error" in line]
    assert len(lines) == 1 and needle in lines[0], result.err


@pytest.mark.parametrize("backbone", ["tiny", "bert_bodied"])
@pytest.mark.parametrize("rollout", [False, True])
def test_a_scorer_that_rolls_rows_out_with_the_backbone_stops_the_run(
    tmp_path, cli, registry_with, rollout, backbone
):
    """A scorer is given the backbone to share its weights: reading each row once is one pass
    of score per row; running the model over more rows (a rollout) is denoising nobody is
    charged for, and the run stops with one line naming the scorer. Also on a backbone whose
    transformer has no `.model` and whose forward runs the body (`base_model`, here
    `transformer.bert`) without the wrapper: the rows it ran were not counted there."""
    registry_with(__name__)
    task = ["arith", "--limit", 2] if backbone == "tiny" else ["toy_sum:size=2"]
    argv = ["run", "--task", *task, "--backbone", backbone, "--steps", 8, "--gen-length", 32]
    argv += ["--scorer", f"prm=lookahead:rollout={rollout}"]
    argv += ["--method", "prm_guided:k=2,every=4+first", "--budget", 20]
    result = cli(*argv, "--out", tmp_path / "r")
    if not rollout:
        assert result.code == 0, result.err
        return
    assert result.code == 3, result.err
    lines = [line for line in result.err.splitlines() if "error" in line]
    assert len(lines) == 1, result.err
    assert "plugin 'lookahead' (from module:test_plugin_reach) broke its contract" in lines[0]
    assert "score() ran the backbone's model over" in lines[0]


@pytest.mark.parametrize(
    "methods,needle",
    [
        (["re_owns:n=2,to=nobody+majority"], "charged to [], not to the methods that own it"),
        (["re_owns:n=2,to=posted+majority"], "charged to [], not to the methods that own it"),
        (
            ["re_owns:n=2,to=overstart+majority"],
            "asked for a forward of copy 2 of ops.start, which belongs to no method",
        ),
        (
            ["re_owns:n=2,to=larger+majority", "re_owns:n=4,to=larger+majority"],
            "candidates [0, 1] that were charged to others",
        ),
    ],
)
def test_rows_charged_to_someone_else_stop_the_run(tmp_path, cli, registry_with, methods, needle):
    registry_with(__name__)
    argv = [*toy_argv(3), "--methods", "orm_rerank,prm_rerank"]
    for method in methods:
        argv += ["--method", method]
    result = cli(*argv, "--budget", 36, "--out", tmp_path / "r")
    assert result.code == 3, result.err
    lines = [line for line in result.err.splitlines() if "error" in line]
    assert len(lines) == 1 and "plugin 're_owns'" in lines[0] and needle in lines[0], result.err


def test_the_same_plugin_charging_its_own_rows_runs(tmp_path, cli, registry_with):
    registry_with(__name__)
    argv = [*toy_argv(3), "--methods", "orm_rerank,prm_rerank"]
    argv += ["--method", "re_owns:n=2,to=self+majority", "--method", "re_owns:n=4,to=self+majority"]
    result = cli(*argv, "--budget", 36, "--out", tmp_path / "r", "--json")
    assert result.code == 0, result.err
    spent = {m["id"]: m["passes_per_problem"] for m in json.loads(result.out)["methods"]}
    assert spent["re_owns:n=2,to=self+majority"] == 16
    assert spent["re_owns:n=4,to=self+majority"] == 32


@pytest.mark.slow
def test_the_contract_kit_fails_a_pool_ordered_by_hash(registry_with, monkeypatch):
    from dllmbench.testing import contracts

    check = contracts.test_strategy_same_result_in_another_process
    registry_with(__name__)
    pairs = [["hash_order", {}], ["peeks_at_the_answer", {}]]
    monkeypatch.setattr(contracts, "strategy_pairs", lambda: [list(p) for p in pairs])
    # this process's hash seed is random: its order may be seed 1's on every problem (one
    # chance in 2 per problem), but seeds 1 and 2 order some problem apart, so one of them fails
    with pytest.raises(AssertionError, match=r"PYTHONHASHSEED=[12] gave other records"):
        check(("hash_order", {}))
    check(("peeks_at_the_answer", {}))  # the same pool in its start order passes
