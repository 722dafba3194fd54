"""A backbone's mistakes are its own, in one line: a step that rewrites the prompt or a
committed token, writes an id outside the vocabulary, or charges no work for what it wrote; a
`step_work` that crashes, gives too few accounts or a negative count; an `encode`,
`finishes_early` or `decode` that crashes or returns the wrong thing; a canvas of two
dimensions. Each was a traceback (exit status 1), a silent wrong result, or blamed on a
built-in strategy or task. This module registers the faulty backbones."""

from __future__ import annotations

import json

import pytest

from dllmbench.api.hookspecs import hookimpl
from dllmbench.core.flops import Work
from dllmbench.testing.doubles import ToyBackbone


class Counted(ToyBackbone):
    """The toy with its own account of a step's work: a full forward over each row."""

    def step_work(self, batch):
        return [Work.full(len(t)) for t in batch.tokens]


class RewritesPrompt(Counted):
    def denoise_step(self, batch):
        out = super().denoise_step(batch)
        for row in out:
            row[0] = (row[0] + 1) % 10
        return out


class RewritesCommitted(Counted):
    def denoise_step(self, batch):
        out = super().denoise_step(batch)
        for row, given, plen in zip(out, batch.tokens, batch.prompt_lens, strict=True):
            if given[plen] != self.mask_id:  # once the first position is written, change it
                row[plen] = (given[plen] + 1) % 10
        return out


class NegativeToken(Counted):
    def denoise_step(self, batch):
        out = super().denoise_step(batch)
        for row, given in zip(out, batch.tokens, strict=True):
            row[(given == self.mask_id).nonzero()[0]] = -1
        return out


class FreeSteps(Counted):
    def step_work(self, batch):
        works = super().step_work(batch)
        return [Work(0, 0, 0), *works[1:]] if batch.steps[0] > 0 else works


class CrashingWork(Counted):
    def step_work(self, batch):
        raise RuntimeError("no account")


class ShortWork(Counted):
    def step_work(self, batch):
        return super().step_work(batch)[:-1] if len(batch.tokens) > 1 else [7]


class NegativeWork(Counted):
    def step_work(self, batch):
        return [Work(len(t), -1, 0) for t in batch.tokens]


class CrashingEncode(Counted):
    def encode(self, prompt):
        raise KeyError("no such word")


class CrashingEarly(Counted):
    def finishes_early(self, settings):
        raise RuntimeError("cannot tell")


class BytesDecode(Counted):
    def decode(self, tokens, prompt_len):
        return super().decode(tokens, prompt_len).encode()


class FlatCanvas(Counted):
    def canvas(self, prompt_ids, gen_length):
        return super().canvas(prompt_ids, gen_length)[None]


class NegativeMask(Counted):
    mask_id = -3


class NoBlocks(Counted):
    """A backbone whose rows cannot set their own block length (HEX's experts)."""

    row_settings = frozenset({"temperature", "threshold", "factor", "steps"})


class UnlistedSteps(Counted):
    """A backbone that lists what its sampler varies, without `steps`, which the engine gives
    every backbone through `StepBatch.totals`."""

    row_settings = frozenset({"temperature", "block_length", "threshold"})


FAULTY = {
    "rewrites_prompt": RewritesPrompt,
    "rewrites_committed": RewritesCommitted,
    "negative_token": NegativeToken,
    "free_steps": FreeSteps,
    "crashing_work": CrashingWork,
    "short_work": ShortWork,
    "negative_work": NegativeWork,
    "crashing_encode": CrashingEncode,
    "crashing_early": CrashingEarly,
    "bytes_decode": BytesDecode,
    "flat_canvas": FlatCanvas,
    "no_blocks": NoBlocks,
    "negative_mask": NegativeMask,
    "unlisted_steps": UnlistedSteps,
}


@hookimpl
def dllmbench_register_backbones(register):
    for name, cls in FAULTY.items():
        register(name, cls)


ME = "(from module:test_backbone_faults)"
CASES = [
    ("rewrites_prompt", "broke its contract: denoise_step() changed row 0's token at position 0"),
    ("rewrites_committed", "denoise_step() changed row 2's token at position 6 from 3 to 4"),
    ("negative_token", "denoise_step() wrote token id -1 in row 0, outside the vocabulary"),
    ("free_steps", "step_work() charged row 0 no query token for a step that wrote tokens"),
    ("crashing_work", "raised RuntimeError: no account"),
    ("short_work", "priced a denoising step with [7]: a list of Work"),
    ("negative_work", "raised ValueError: Work.attended is -1: a count, an int >= 0"),
    ("crashing_encode", "raised KeyError: 'no such word'"),
    ("crashing_early", "raised RuntimeError: cannot tell"),
    ("bytes_decode", "broke its contract: decode() returned a bytes, not a string"),
    ("flat_canvas", "broke its contract: canvas() gave a tensor of shape (1, "),
    ("negative_mask", "broke its contract: its mask_id is -3: a token id, an int >= 0"),
]


@pytest.mark.parametrize(("backbone", "needle"), CASES, ids=[c[0] for c in CASES])
def test_a_backbones_mistake_is_its_broken_contract_in_one_line(
    tmp_path, cli, registry_with, backbone, needle
):
    registry_with(__name__)
    argv = ["run", "--task", "toy_sum:size=3", "--backbone", backbone, "--steps", 8]
    argv += ["--gen-length", 5, "--method", "independent:n=2+majority", "--budget", 16]
    result = cli(*argv, "--out", tmp_path / "r")
    assert result.code == 3, result.err
    lines = [line for line in result.err.splitlines() if "error" in line]
    assert len(lines) == 1, result.err
    assert f"'{backbone}' {ME}" in lines[0] and needle in lines[0], result.err
    assert "Traceback" not in result.err


def test_a_family_whose_rows_set_what_the_backbone_cannot_vary_is_left_out(
    tmp_path, cli, registry_with
):
    """HEX's rows set their block length: on a backbone that cannot vary it, `all` leaves HEX
    out with the reason (the run stopped as it began, naming neither), and naming it is one
    line before any model loads."""
    registry_with(__name__)
    common = ["--task", "toy_sum:size=3", "--backbone", "no_blocks", "--steps", 8]
    common += ["--gen-length", 5, "--budget", 16]
    planned = cli("plan", *common)
    assert planned.code == 0, planned.err
    reason = "hex — its rows set block_length, which the backbone cannot vary per row"
    assert reason in " ".join(planned.out.split())
    assert "HEX" not in planned.out.split("left out")[0]
    named = cli("run", *common, "--methods", "hex,vanilla", "--out", tmp_path / "r")
    assert named.code == 2, named.err
    assert "method 'hex': its rows set block_length" in named.err
    assert "Traceback" not in named.err
    ran = cli("run", *common, "--methods", "all", "--out", tmp_path / "all")
    assert ran.code == 0, ran.err
    assert "left out: hex" in ran.err + ran.out


def test_a_row_sets_its_own_t_on_a_backbone_that_does_not_list_steps(tmp_path, cli, registry_with):
    """`steps` (a row's own T) reaches every backbone through `StepBatch.totals`, and `ops`
    always takes it; the planner refused ReMDM with `extra` steps on a backbone whose
    `row_settings` did not name it ("its rows set steps, which the backbone cannot vary")."""
    registry_with(__name__)
    common = ["--task", "toy_sum:size=3", "--backbone", "unlisted_steps", "--steps", 8]
    common += ["--gen-length", 5, "--budget", 24]
    planned = cli("plan", *common, "--method", "remdm:n=2,extra=4+majority")
    assert planned.code == 0, planned.err
    ran = cli("run", *common, "--method", "remdm:n=2,extra=4+majority", "--out", tmp_path / "r")
    assert ran.code == 0, ran.err
    records = [json.loads(line) for line in (tmp_path / "r" / "samples.jsonl").open()]
    assert len(records) == 3
    assert all(r["ledger"]["passes"] == {"denoise": 2 * (8 + 4)} for r in records)
