"""load_target / Setup (SPEC 2.1): every bad target is a DiagkitError whose message names the
problem and what was expected, never a bare traceback from deep inside."""

from __future__ import annotations

import textwrap

import pytest
import torch

import diagkit
from diagkit import DiagkitError, Setup, load_target
from diagkit.core.errors import TargetError

# One target file whose `build` returns a valid mapping, then applies the test's edits:
# drop=(keys to remove), set={key: value or a name from VALUES}.
TARGET_SOURCE = textwrap.dedent('''
    import torch

    def _parts():
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return model, optimizer

    VALUES = {
        "a_string": "not a module",
        "an_int": 5,
        "two_optimizers": "two_optimizers",
        "train_step": lambda i: None,
        "batch_fn": lambda: torch.ones(4, 3),
        "a_list_of_sgd": "a_list_of_sgd",
    }

    def build(drop=(), set=None):
        model, optimizer = _parts()
        mapping = {
            "model": model,
            "optimizer": optimizer,
            "batch_fn": lambda: torch.ones(4, 3),
            "loss_fn": lambda m, b: m(b).sum(),
        }
        for key in drop:
            del mapping[key]
        for key, value in (set or {}).items():
            if value == "a_list_of_sgd":
                value = [optimizer]
            mapping[key] = value
        return mapping

    def as_setup():
        model, optimizer = _parts()
        return __import__("diagkit").Setup(model=model, optimizers=[optimizer],
                                           train_step=lambda i: None, steps=2)

    def not_a_mapping():
        return [1, 2, 3]

    def returns_none():
        return None

    def raises_when_called():
        raise RuntimeError("cannot reach the dataset server")

    def needs(size, depth=2):
        model, optimizer = _parts()
        return {"model": model, "optimizer": optimizer, "train_step": lambda i: None}

    not_callable = 42
''')


@pytest.fixture(scope="module")
def target_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("targets") / "my_target.py"
    path.write_text(TARGET_SOURCE)
    return path


def error_of(spec, **kwargs) -> str:
    with pytest.raises(DiagkitError) as info:
        load_target(spec, **kwargs)
    assert isinstance(info.value, TargetError)
    message = str(info.value)
    assert message and "\n" not in message.strip()
    return message


# ------------------------------------------------------------------ targets that work
def test_a_py_file_target_works(target_file):
    setup = load_target(f"{target_file}:build")
    assert isinstance(setup, Setup)
    assert isinstance(setup.model, torch.nn.Linear)
    assert len(setup.optimizers) == 1 and isinstance(setup.optimizers[0], torch.optim.SGD)
    assert callable(setup.batch_fn) and callable(setup.loss_fn) and setup.train_step is None
    assert setup.zero_grad_set_to_none is True and setup.steps is None


def test_a_package_module_target_works_with_kwargs():
    setup = load_target("diagkit.demos:clean", steps=3, batch=4)
    assert isinstance(setup.model, torch.nn.Module)
    assert setup.steps == 3


def test_a_target_returning_a_setup_works(target_file):
    setup = load_target(f"{target_file}:as_setup")
    assert isinstance(setup, Setup)
    assert setup.steps == 2 and setup.train_step is not None


def test_optimizers_list_is_accepted(target_file):
    setup = load_target(f"{target_file}:build", drop=("optimizer",),
                        set={"optimizers": "a_list_of_sgd"})
    assert len(setup.optimizers) == 1


def test_a_file_target_diagnoses(target_file):
    diag = diagkit.diagnose(load_target(f"{target_file}:build"), steps=2)
    assert diag.verdicts() == {"weight": {"ok"}, "bias": {"ok"}}


# ------------------------------------------------------------------ the spec string
@pytest.mark.parametrize("spec", ["diagkit.demos", "diagkit.demos:", ":clean", "a:b:c", "",
                                  "diagkit.demos.clean"])
def test_malformed_spec(spec):
    message = error_of(spec)
    assert "package.module:function" in message


def test_module_that_does_not_exist():
    message = error_of("no_such_package_xyz.train:build")
    assert "no_such_package_xyz.train" in message
    assert "module" in message


def test_submodule_that_does_not_exist():
    message = error_of("diagkit.demos.nope_nope:build")
    assert "diagkit.demos.nope_nope" in message


def test_function_that_does_not_exist():
    message = error_of("diagkit.demos:no_such_builder")
    assert "no_such_builder" in message


def test_name_that_is_not_a_function(target_file):
    message = error_of(f"{target_file}:not_callable")
    assert "not_callable" in message


def test_file_that_does_not_exist(tmp_path):
    missing = tmp_path / "nowhere" / "train.py"
    message = error_of(f"{missing}:build")
    assert str(missing) in message


def test_file_that_raises_on_import(tmp_path):
    path = tmp_path / "broken_import.py"
    path.write_text("import torch\nraise ImportError('the cluster config is missing')\n"
                    "def build():\n    pass\n")
    message = error_of(f"{path}:build")
    assert "broken_import.py" in message and "the cluster config is missing" in message


def test_module_that_raises_on_import(tmp_path, monkeypatch):
    (tmp_path / "diagkit_test_badmod.py").write_text("raise ValueError('bad global state')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    message = error_of("diagkit_test_badmod:build")
    assert "diagkit_test_badmod" in message and "bad global state" in message


def test_target_function_that_raises_when_called(target_file):
    message = error_of(f"{target_file}:raises_when_called")
    assert "raises_when_called" in message
    assert "cannot reach the dataset server" in message


# ------------------------------------------------------------------ arguments
def test_unexpected_keyword_argument_lists_accepted_args():
    message = error_of("diagkit.demos:clean", widht=3)
    assert "widht" in message
    for accepted in ("steps", "seed", "batch", "lr", "weight_decay"):
        assert accepted in message


def test_missing_required_argument_lists_accepted_args(target_file):
    message = error_of(f"{target_file}:needs")
    assert "size" in message and "depth" in message


def test_required_argument_given_works(target_file):
    assert isinstance(load_target(f"{target_file}:needs", size="tiny"), Setup)


# ------------------------------------------------------------------ what the target returns
def test_unknown_key(target_file):
    message = error_of(f"{target_file}:build", set={"optimiser": "an_int"})
    assert "'optimiser'" in message
    assert "optimizer" in message.replace("'optimiser'", "")  # says what was expected


def test_missing_model(target_file):
    message = error_of(f"{target_file}:build", drop=("model",))
    assert "'model'" in message


def test_missing_optimizer(target_file):
    message = error_of(f"{target_file}:build", drop=("optimizer",))
    assert "'optimizer'" in message


def test_both_optimizer_and_optimizers(target_file):
    message = error_of(f"{target_file}:build", set={"optimizers": "a_list_of_sgd"})
    assert "'optimizer'" in message and "'optimizers'" in message


def test_both_train_step_and_batch_fn(target_file):
    message = error_of(f"{target_file}:build", drop=("loss_fn",),
                       set={"train_step": "ignored"})
    assert "train_step" in message and "batch_fn" in message


def test_only_batch_fn(target_file):
    message = error_of(f"{target_file}:build", drop=("loss_fn",))
    assert "loss_fn" in message


def test_neither_loop(target_file):
    message = error_of(f"{target_file}:build", drop=("loss_fn", "batch_fn"))
    assert "train_step" in message and "batch_fn" in message


def test_returns_a_non_mapping(target_file):
    message = error_of(f"{target_file}:not_a_mapping")
    assert "mapping" in message and "list" in message


def test_returns_none(target_file):
    message = error_of(f"{target_file}:returns_none")
    assert "mapping" in message and "NoneType" in message


@pytest.mark.parametrize("key, value, words", [
    ("model", "not a module", ["'model'", "Module", "str"]),
    ("optimizer", 5, ["optimizer", "Optimizer", "int"]),
    ("optimizer", "an_int", ["optimizer", "Optimizer", "str"]),
    ("steps", 0, ["'steps'", "positive", "0"]),
    ("steps", "5", ["'steps'", "positive", "'5'"]),
    ("steps", -1, ["'steps'", "-1"]),
    ("steps", True, ["'steps'"]),
    ("batch_fn", 7, ["'batch_fn'", "callable", "int"]),
    ("loss_fn", "mse", ["'loss_fn'", "callable", "str"]),
    ("zero_grad_set_to_none", "yes", ["zero_grad_set_to_none"]),
    ("lr_scheduler", 3, ["lr_scheduler"]),
])
def test_wrong_types(target_file, key, value, words):
    message = error_of(f"{target_file}:build", set={key: value})
    for word in words:
        assert word in message, (word, message)


def test_empty_optimizer_list(target_file):
    message = error_of(f"{target_file}:build", drop=("optimizer",), set={"optimizers": []})
    assert "optimizer" in message and "empty" in message


# ------------------------------------------------------------------ Setup directly
def test_setup_validates_directly():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(DiagkitError, match="'model'"):
        Setup(model="nope", optimizers=[opt], train_step=lambda i: None)
    with pytest.raises(DiagkitError, match="optimizer"):
        Setup(model=model, optimizers=[object()], train_step=lambda i: None)
    with pytest.raises(DiagkitError, match="'train_step' must be callable"):
        Setup(model=model, optimizers=[opt], train_step=3)
    setup = Setup(model=model, optimizers=opt, train_step=lambda i: None)
    assert setup.optimizers == [opt]


def test_diagnose_rejects_bad_steps():
    setup = load_target("diagkit.demos:clean")
    for bad in (0, -3, "5", 2.0, True):
        with pytest.raises(DiagkitError, match="steps"):
            diagkit.diagnose(setup, steps=bad)
