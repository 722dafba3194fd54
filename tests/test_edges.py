"""The edges a newcomer hits: damaged run-directory files, devices this torch cannot use, huge
budgets and canvases, numbers that are not ASCII digits, repeated options, folders that belong
to something else. Each is one line, exit status 2, no traceback, and leaves folders as they
were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TOY_RUN, assert_user_error, snapshot

from dllmbench.plugins.backbones.base import DiffusionBackbone

TINY = ["run", "--task", "arith:test_size=4", "--steps", "4", "--gen-length", "8", "--limit", "2"]


@pytest.fixture
def no_backbone(monkeypatch):
    """Building a model backbone is a test failure: the mistake had to be found before."""

    def built(self, *args, **kwargs):
        raise AssertionError("the backbone was built before the mistake was found")

    monkeypatch.setattr(DiffusionBackbone, "__init__", built)


def edit_json(file: Path, edit) -> None:
    data = json.loads(file.read_text())
    file.write_text(json.dumps(edit(data)))


def without(key: str, where: tuple = ()):
    def edit(data):
        target = data
        for step in where:
            target = target[step]
        del target[key]
        return data

    return edit


# -- 1. damaged manifest.json and results.json: report and merge ---------------------------------

MANIFEST_DAMAGE = [
    ("empty object", lambda m: {}, "is damaged: lacks '"),
    ("no methods", without("methods"), "lacks 'methods'"),
    ("a method without its id", without("id", ("methods", 1)), "methods[1] lacks 'id'"),
    ("no task problems", without("problems", ("task",)), "task lacks 'problems'"),
    ("seed not an int", lambda m: {**m, "sampling": {**m["sampling"], "seed": "x"}}, "seed"),
    ("methods not a list", lambda m: {**m, "methods": {}}, "methods is not a list"),
    ("no budgets", lambda m: {**m, "budgets": []}, "budgets is empty"),
    ("budgets descending", lambda m: {**m, "budgets": [9, 3]}, "positive and ascending"),
    ("no resamples", lambda m: {**m, "statistics": {"resamples": 0, "level": 0.95}}, "1 to"),
    ("negative resamples", lambda m: {**m, "statistics": {"resamples": -1, "level": 0.9}}, "1 to"),
    ("level of 1", lambda m: {**m, "statistics": {"resamples": 9, "level": 1}}, "level 1 is not"),
    ("a method without cost", without("cost", ("methods", 0)), "methods[0] lacks 'cost'"),
    # values of the right type that no run writes: each one place, `shape._manifest_values`
    ("budget not the largest", lambda m: {**m, "budget": 7}, "budget 7 is not the largest"),
    ("an unknown unit", lambda m: {**m, "budget_unit": "bits"}, "budget_unit 'bits' is not"),
    ("no steps", lambda m: edit(m, "sampling", total_steps=0), "sampling.total_steps 0 is not"),
    ("no canvas", lambda m: edit(m, "sampling", gen_length=-3), "sampling.gen_length -3 is not"),
    ("negative seed", lambda m: edit(m, "sampling", seed=-1), "sampling.seed -1 is not 0 to"),
    ("no problems", lambda m: edit(m, "task", problems=0), "task.problems 0 is not positive"),
    ("ids unlike problems", lambda m: edit(m, "task", problem_ids=[]), "lists 0 problems"),
    ("an id twice", lambda m: edit(m, "task", problem_ids=["a", "a"], problems=2), "'a' twice"),
    ("methods empty", lambda m: {**m, "methods": []}, "methods is empty"),
    ("a method twice", lambda m: {**m, "methods": m["methods"][:1] * 2}, "the id 'Vanilla' twice"),
    ("a negative cost", lambda m: edit_method(m, cost={"denoise": -5}), ".cost.denoise -5 is"),
    ("negative flops", lambda m: edit_method(m, flops=-1), "methods[0].flops -1 is negative"),
    ("a method at no budget", lambda m: edit_method(m, budgets=[]), "budgets [] are not some of"),
    ("a method elsewhere", lambda m: edit_method(m, budgets=[999]), "budgets [999] are not some"),
    ("an unknown reference", lambda m: {**m, "reference": "Nope"}, "reference 'Nope' is not one"),
]


def edit(manifest: dict, key: str, **values) -> dict:
    """The manifest with `values` in its object `key`."""
    return {**manifest, key: {**manifest[key], **values}}


def edit_method(manifest: dict, **values) -> dict:
    """The manifest with `values` in its first method."""
    return {**manifest, "methods": [{**manifest["methods"][0], **values}, *manifest["methods"][1:]]}


@pytest.mark.parametrize("command", ["report", "merge"])
@pytest.mark.parametrize("how,edit,needle", MANIFEST_DAMAGE, ids=[d[0] for d in MANIFEST_DAMAGE])
def test_a_damaged_manifest_is_one_line_naming_it(cli, finished_run, command, how, edit, needle):
    manifest = finished_run / "manifest.json"
    edit_json(manifest, edit)
    before = snapshot(finished_run)
    result = cli(command, finished_run)
    assert_user_error(result, f"{manifest} is damaged", needle, "restore it from a copy")
    assert snapshot(finished_run) == before


RESULTS_DAMAGE = [
    ("empty object", lambda r: {}, "lacks 'schema_version'"),
    ("no resamples", without("resamples"), "lacks 'resamples'"),
    ("a method without accuracy", without("accuracy", ("methods", 0)), "methods[0] lacks"),
    ("an interval without low", without("low", ("methods", 0, "accuracy")), "lacks 'low'"),
    ("budgets not a list", lambda r: {**r, "budgets": 3}, "budgets is not a list"),
    # values of the right type that merge never writes: the report's bootstrap reads them
    ("no budgets", lambda r: {**r, "budgets": []}, "budgets is empty"),
    ("an unknown unit", lambda r: {**r, "budget_unit": "bits"}, "budget_unit 'bits' is not"),
    ("zero resamples", lambda r: {**r, "resamples": 0}, "resamples 0 is not 1 to 100000"),
    ("too many resamples", lambda r: {**r, "resamples": 10**11}, "resamples 100000000000 is"),
    ("a level of 2", lambda r: {**r, "level": 2}, "level 2 is not between 0 and 1"),
]


@pytest.mark.parametrize("how,edit,needle", RESULTS_DAMAGE, ids=[d[0] for d in RESULTS_DAMAGE])
def test_a_damaged_results_file_is_one_line_saying_merge_rewrites_it(
    cli, finished_run, how, edit, needle
):
    results = finished_run / "results.json"
    edit_json(results, edit)
    before = snapshot(finished_run)
    result = cli("report", finished_run)
    assert_user_error(result, f"{results} is damaged", needle, f"dllmbench merge {finished_run}")
    assert snapshot(finished_run) == before
    # and what it says works: merge writes it again from the records, then report reads it
    assert cli("merge", finished_run).code == 0
    assert cli("report", finished_run).code == 0


# -- 1. devices this torch build does not have, before anything loads ----------------------------


@pytest.mark.parametrize(
    "device,needle",
    [
        ("banana", "device 'banana' is not a torch device"),
        ("cuda:x", "is not a torch device"),
        ("quantum", "is not a torch device"),
    ],
)
def test_a_device_that_is_not_a_device(cli, tmp_path, no_backbone, device, needle):
    result = cli(*TINY, "--backbone", f"tiny:device={device}", "--out", tmp_path / "r")
    assert_user_error(result, f"backbone 'tiny' with device={device}", needle)
    assert not (tmp_path / "r").exists()


def test_a_device_this_build_lacks(cli, tmp_path, no_backbone, monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    result = cli(*TINY, "--backbone", "tiny:device=cuda", "--out", tmp_path / "r")
    assert_user_error(result, "device 'cuda': this torch", "built without CUDA", "device=cpu")
    assert not (tmp_path / "r").exists()
    plan = cli("plan", "--task", "arith", "--backbone", "llada:device=cuda:0", "--budget", "64")
    assert_user_error(plan, "backbone 'llada' with device=cuda:0", "built without CUDA")


def test_a_cuda_device_beyond_those_visible(cli, tmp_path, no_backbone, monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    result = cli(*TINY, "--backbone", "tiny:device=cuda:2", "--out", tmp_path / "r")
    assert_user_error(result, "there are 2 CUDA devices (cuda:0 to cuda:1)")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    result = cli(*TINY, "--backbone", "tiny:device=cuda", "--out", tmp_path / "r")
    assert_user_error(result, "no CUDA device is visible")
    assert not (tmp_path / "r").exists()


# -- 2. budgets the planner answers at once; canvases beyond the model's positions ---------------


def test_a_budget_beyond_any_plan_is_one_line(cli):
    for budget in ("1" + "0" * 30, "10000001"):
        result = cli("plan", "--budget", budget)
        assert_user_error(result, "argument --budget: must be at most 10000000")
    assert_user_error(cli(*TOY_RUN, "--budget", "72," + "9" * 40), "must be at most 10000000")


def test_the_planner_builds_a_few_configurations_not_one_per_size(monkeypatch):
    from dllmbench.execution import planner
    from dllmbench.loading.registry import registry

    built = []
    real = planner._try_build
    monkeypatch.setattr(planner, "_try_build", lambda *a: built.append(a[1]) or real(*a))
    result = planner.plan(registry(), 10_000_000, 128, ["majority", "top_m"])
    assert [p.method.id for p in result.methods] == [
        "Majority@78125",
        "Top-2 Retention K=76922 b=64",  # 130 passes a particle, k even
    ]
    assert len(built) < 200  # a loop over every size built 78,000 and more


def test_the_planner_finds_what_a_size_by_size_search_finds():
    """The largest size within the budget, every built-in family, at budgets on each side of
    the first costs it takes and a few more: the same as trying each size in turn (sizes a
    strategy refuses, such as an odd k where keep is 2, or n below prism's final, included)."""
    from dllmbench.core.errors import PluginError
    from dllmbench.execution import planner
    from dllmbench.execution.method import Method
    from dllmbench.loading.registry import registry

    reg = registry()
    for steps in (3, 8):
        for family in reg.families():
            spec = planner.family_spec(family, steps)
            if spec.free_field() is None:
                continue
            costs = {}
            for size in range(1, 122):
                method = planner._try_build(reg, spec.with_size(size), None, None)
                if isinstance(method, Method):
                    costs[size] = method.total_cost(steps)
            edges = {c + d for c in sorted(set(costs.values()))[:6] for d in (-1, 0)}
            for budget in sorted({b for b in edges if b >= 1} | {1, 59, 120}):
                if not any(size <= max(budget, planner.SCAN) + 1 for size in costs):
                    with pytest.raises(PluginError):  # no size it may try builds
                        planner.fit(reg, spec, None, None, budget, steps)
                    continue
                method, smallest = planner.fit(reg, spec, None, None, budget, steps)
                fitting = [size for size, cost in costs.items() if cost <= budget]
                assert smallest == costs[min(costs)]
                want = max(fitting) if fitting else None
                got = method and method.spec.strategy_config[spec.free_field()]
                assert got == want, (family.name, steps, budget)


@pytest.mark.parametrize("length", ["256", "400", "100000"])
def test_a_canvas_beyond_the_models_positions_is_one_line(cli, tmp_path, no_backbone, length):
    needle = f"--gen-length {length} does not fit backbone 'tiny': its model has 256 positions"
    result = cli(*TINY, "--backbone", "tiny", "--gen-length", length, "--out", tmp_path / "r")
    assert_user_error(result, needle, "below 256")
    assert not (tmp_path / "r").exists()
    plan = cli(
        "plan", "--task", "arith", "--backbone", "tiny", "--gen-length", length, "--budget", "99"
    )
    assert_user_error(plan, needle)
    assert_user_error(cli("run", "--gen-length", length), needle)  # the demo


# -- 5. numbers are ASCII digits, bounded; an option given twice; a run directory given twice ----


@pytest.mark.parametrize(
    "option,value,needle",
    [
        ("--budget", "2_08", "must be an integer, got '2_08'"),
        ("--budget", "٢٠٨", "must be an integer, got '٢٠٨'"),
        ("--budget", "72,٢٠٨", "must be an integer, got '٢٠٨'"),
        ("--seed", "99999999999999999999999", "must be at most 9223372036854775807"),
        ("--seed", "1_0", "must be an integer"),
        ("--steps", "８", "must be an integer"),  # a full-width digit
        ("--limit", "1e3", "must be an integer"),
        ("--resamples", "²", "must be an integer"),
    ],
)
def test_numbers_are_ascii_digits_and_bounded(cli, finished_run, option, value, needle):
    before = snapshot(finished_run)
    result = cli(*TOY_RUN, option, value, "--out", finished_run)
    assert_user_error(result, f"argument {option}", needle)
    assert snapshot(finished_run) == before


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--task", "toy_sum:size=4_0"], "option size wants an int, got '4_0'"),
        (["--task", "toy_sum:size=٤"], "option size wants an int, got '٤'"),
        (["--backbone", "toy:p_correct=٠.5"], "option p_correct wants a number"),
        (["--task", "toy_sum:size=4,size=3"], "option 'size' is given twice in 'toy_sum:size"),
        (["--method", "independent:n=2,n=3+majority"], "option 'n' is given twice"),
        (["--scorer", "other=toy:noise=1,noise=2"], "option 'noise' is given twice"),
        (  # a second orm beside the run's own would silently replace it
            ["--scorer", "orm=toy:noise=2"],
            "--scorer orm is given twice ('orm=toy:partial=false' and 'orm=toy:noise=2')",
        ),
    ],
)
def test_plugin_numbers_are_ascii_and_options_are_given_once(cli, finished_run, argv, needle):
    before = snapshot(finished_run)
    result = cli(*TOY_RUN, *argv, "--out", finished_run)
    assert_user_error(result, needle)
    assert snapshot(finished_run) == before


@pytest.mark.parametrize(
    "methods",
    ["vanilla,vanilla", "vanilla,independent:n=1+first", "independent:n=1+first,vanilla"],
)
def test_a_method_listed_twice_runs_once_under_its_familys_name(cli, methods):
    """A family and its own spec (in either order), or a family named twice, is one method."""
    argv = ["plan", "--task", "arith", "--backbone", "tiny", "--budget", "64,128"]
    result = cli(*argv, "--methods", methods, "--json")
    assert result.code == 0, result.err
    planned = [(m["id"], m["budgets"]) for m in json.loads(result.out)["methods"]]
    assert planned == [("Vanilla", [64, 128])]


def test_plan_refuses_an_unknown_scorer_as_run_does(cli, tmp_path):
    argv = ["--task", "arith", "--backbone", "tiny", "--budget", "1024"]
    methods = ["--methods", "prm_guided:scorer=nosuch"]
    for result in (cli("plan", *argv, *methods), cli("run", *argv, *methods, "--out", tmp_path)):
        assert_user_error(result, "scorer", "nosuch")  # plan accepted it before


def test_a_run_directory_given_twice_to_report(cli, finished_run):
    before = snapshot(finished_run)
    result = cli("report", finished_run, finished_run / ".." / finished_run.name)
    assert_user_error(result, "is given twice", "give each run directory once")
    assert snapshot(finished_run) == before


# -- 6. task errors name the task ----------------------------------------------------------------


def test_an_unknown_task_is_named_before_a_missing_backbone(cli, tmp_path):
    result = cli("run", "--task", "nosuch", "--out", tmp_path / "r")
    assert_user_error(result, "unknown task 'nosuch'; known: ", "toy_sum")
    assert_user_error(cli("run", "--task", "toy_sum", "--backbone", "nosuch"), "unknown backbone")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--task", "toy_sum:foo"], "task 'toy_sum' option 'foo' is not key=value; its options: "),
        (["--backbone", "toy:fast"], "backbone 'toy' option 'fast' is not key=value; its options"),
        (["--scorer", "other=toy:x"], "scorer 'toy' option 'x' is not key=value; its options: "),
    ],
)
def test_an_option_that_is_not_key_value_names_the_plugins_options(cli, finished_run, argv, needle):
    before = snapshot(finished_run)
    assert_user_error(cli(*TOY_RUN, *argv, "--out", finished_run), needle)
    assert snapshot(finished_run) == before


# -- 3. a command never writes into a folder that belongs to something else ----------------------

COLLECT = ["collect", "--task", "toy_sum:size=2", "--backbone", "toy", "--n", "2", "--steps", "8"]
COLLECT += ["--gen-length", "5"]


@pytest.fixture
def collection(cli, tmp_path) -> Path:
    out = tmp_path / "collection"
    assert cli(*COLLECT, "--out", out).code == 0
    return out


@pytest.fixture
def retrain_never_starts(monkeypatch):
    import dllmbench.demo.retrain as retrain

    def started(*args, **kwargs):
        raise AssertionError("the retrain started before its folder was checked")

    monkeypatch.setattr(retrain, "retrain", started)


def foreign_targets(tmp_path: Path, finished_run: Path, collection: Path) -> dict[str, Path]:
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("mine")
    (tmp_path / "a-file").write_text("mine")
    return {
        "a run directory": finished_run,
        "a collection": collection,
        "a checkpoint": Path(tmp_path / "ckpt"),
        "a folder of other files": other,
        "a file": tmp_path / "a-file",
    }


COMMANDS = {
    "collect": COLLECT,
    "train-scorer": ["train-scorer", "--kind", "orm", "--steps", "1"],  # --data added below
    "demo retrain": ["demo", "retrain"],
    "report": ["report"],  # the run added below
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_refuses_a_folder_that_belongs_to_something_else(
    cli, tmp_path, finished_run, collection, retrain_never_starts, command
):
    targets = foreign_targets(tmp_path, finished_run, collection)
    ckpt = targets["a checkpoint"]
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    argv = list(COMMANDS[command])
    if command == "train-scorer":
        argv += ["--data", collection]
    if command == "report":
        argv += [finished_run]
    for what, target in targets.items():
        if command == "collect" and what == "a collection":
            continue  # its own: resumed
        before = snapshot(tmp_path)
        result = cli(*argv, "--out", target)
        needle = "is not a folder" if what == "a file" else str(target)
        assert_user_error(result, needle, "choose another --out")
        assert snapshot(tmp_path) == before, what


@pytest.mark.parametrize("command", [*sorted(COMMANDS), "run", "diagnose"])
def test_an_empty_out_is_one_line(cli, tmp_path, finished_run, collection, command, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = list({**COMMANDS, "run": TOY_RUN, "diagnose": ["diagnose", collection]}[command])
    if command == "train-scorer":
        argv += ["--data", collection]
    if command == "report":
        argv += [finished_run]
    before = snapshot(tmp_path)
    assert_user_error(cli(*argv, "--out", ""), "--out is empty")
    assert snapshot(tmp_path) == before


def test_demo_retrain_checks_its_folder_before_pretraining(cli, tmp_path, retrain_never_starts):
    file = tmp_path / "file"
    file.write_text("mine")
    assert_user_error(cli("demo", "retrain", "--out", file), "is not a folder")
    assert_user_error(cli("demo", "retrain", "--out", file / "x"), f"{file} is not a folder")
    assert_user_error(cli("demo", "retrain", "--out", "/proc/dllmbench"), "cannot write to /proc")
    assert file.read_text() == "mine"


@pytest.fixture
def settings_found_late(monkeypatch):
    """A strategy that does not declare the settings its config fixes (a third-party one need
    not), so the backbone refuses them only once rows start, after the run has begun."""
    from dllmbench.execution import planner

    monkeypatch.setattr(planner, "settings_by_config", lambda strategy: [])


def test_a_run_refused_at_its_first_problem_leaves_its_directory_as_it_was(
    cli, tmp_path, settings_found_late
):
    """A row setting the backbone refuses only once rows start (EB-Sampler's bound on a Dream
    sampler that draws its order at random, from a strategy that does not declare it) is one
    line, and the run directory it had just begun is taken back: a folder it made is gone, a
    folder that was there stays empty, and the corrected command runs in it."""
    method = ["--method", "threshold:n=2,entropy_bound=0.5+majority", "--budget", "16"]
    for out in (tmp_path / "new", tmp_path / "there"):
        if out.name == "there":
            out.mkdir()
        argv = [*TINY, "--backbone", "tiny:alg=origin", *method, "--out", out]
        assert_user_error(cli(*argv), "which alg=origin does not rank by")
        if out.name == "new":
            assert not out.exists()
        else:
            assert list(out.iterdir()) == []
        fixed = cli(*TINY, "--backbone", "tiny", *method, "--out", out)
        assert fixed.code == 0, fixed.err
        assert (out / "manifest.json").is_file() and (out / "samples.jsonl").is_file()


def test_a_take_back_cut_short_leaves_the_run_begun_and_says_the_refusal(
    cli, tmp_path, monkeypatch, settings_found_late
):
    """The manifest goes last: a take-back that cannot finish (a disk that refuses an unlink,
    a kill) leaves the run begun, which the same command resumes, not files without a
    manifest that every command refuses; and the refusal is still the one line said."""
    out = tmp_path / "run"
    unlink = Path.unlink

    def refusing(self, *args, **kwargs):
        if self.name == "compute.json":
            raise PermissionError(13, "Permission denied", str(self))
        return unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", refusing)
    method = ["--method", "threshold:n=2,entropy_bound=0.5+majority", "--budget", "16"]
    argv = [*TINY, "--backbone", "tiny:alg=origin", *method, "--out", out]
    assert_user_error(cli(*argv), "which alg=origin does not rank by")
    assert (out / "manifest.json").is_file()
    monkeypatch.setattr(Path, "unlink", unlink)
    assert_user_error(cli(*argv), "which alg=origin does not rank by")  # resumed, refused
    assert (out / "manifest.json").is_file()  # a resumed run keeps everything


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--task", ":"], "--task ':' names no task; give task[:option=value,...]"),
        (["--backbone", ":x=1"], "--backbone ':x=1' names no backbone; give backbone"),
        (["--scorer", "other=:x=1"], "--scorer ':x=1' names no scorer; give NAME=PLUGIN"),
    ],
)
def test_a_plugin_argument_without_a_name_says_so_not_method_spec(cli, finished_run, argv, needle):
    result = cli(*TOY_RUN, *argv, "--out", finished_run)
    assert_user_error(result, needle)
    assert "method spec" not in result.err


def test_collect_and_train_scorer_name_the_plugin_of_an_option_that_is_not_key_value(
    cli, tmp_path, collection
):
    result = cli(*COLLECT[:2], ":", *COLLECT[3:], "--out", tmp_path / "c")
    assert_user_error(result, "--task ':' names no task")
    result = cli(*COLLECT[:4], "toy:fast", *COLLECT[5:], "--out", tmp_path / "c")
    assert_user_error(result, "backbone 'toy' option 'fast' is not key=value; its options")
    assert not (tmp_path / "c").exists()
    train = ["train-scorer", "--kind", "orm", "--steps", "1", "--data", collection]
    result = cli(*train, "--options", "pooling", "--out", tmp_path / "t")
    assert_user_error(result, "scorer 'orm' option 'pooling' is not key=value; its options")
    assert "method spec" not in result.err


def test_train_scorer_says_n_a_for_a_roc_auc_it_has_not(tmp_path):
    """One class in a validation bucket has no ROC-AUC: the summary says `n/a`, as the
    training log does, not Python's `None`."""
    from rich.console import Console

    from dllmbench.cli.train_scorer import _show

    best = {"step": 5, "bce": 0.5, "accuracy": 0.75, "auc": None, "rerank": {"problems": 0}}
    best["by_mask_ratio"] = {"[0.0,0.1)": {"n": 4, "auc": None}, "[0.9,1.0]": {"n": 4, "auc": 0.5}}
    console = Console(record=True, width=200)
    _show(console, {"best": best}, tmp_path)
    text = console.export_text()
    assert "None" not in text, text
    assert "ROC-AUC n/a)" in text and "n=4 ROC-AUC n/a" in text and "ROC-AUC 0.500" in text
