"""One meaning of each precision (spikefuse.precision): the flags applied() sets, that the
caller's settings come back, and that Trainer/fit, `spikefuse train` and the kernels' TF32
choice all follow it. CPU only: the flags are process settings, readable without a GPU."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from spikefuse import precision as precisions
from spikefuse.cli import main
from spikefuse.ops.kernel_base import tf32_matmuls
from spikefuse.train import checkpoint
from spikefuse.train.loop import Trainer
from test_train_data import install, make_splits

b = torch.backends
NEW_API = hasattr(b.cuda.matmul, "fp32_precision")  # torch >= 2.9
needs_new_api = pytest.mark.skipif(not NEW_API, reason="torch < 2.9 has no fp32_precision")


def flags():
    """(TF32 matmuls, TF32 cuDNN convolutions): the two switches every precision sets."""
    return b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32


def settings() -> dict:
    """Everything a caller can read about float32 math, an error counting as a reading (the
    legacy getters raise after a caller mixed in the newer fp32_precision API)."""
    getters = {"allow_tf32": lambda: b.cuda.matmul.allow_tf32, "cudnn": lambda: b.cudnn.allow_tf32,
               "matmul_precision": torch.get_float32_matmul_precision}
    if NEW_API:
        getters.update({f"{name}.fp32_precision": (lambda m=module: m.fp32_precision) for name, module in [
            ("backends", b), ("cuda.matmul", b.cuda.matmul), ("cudnn", b.cudnn), ("cudnn.conv", b.cudnn.conv),
            ("cudnn.rnn", b.cudnn.rnn), ("mkldnn", b.mkldnn), ("mkldnn.matmul", b.mkldnn.matmul)]})
    readings = {}
    for name, get in getters.items():
        try:
            readings[name] = get()
        except RuntimeError:
            readings[name] = "raises"
    return readings


def pytorch_defaults():
    torch.set_float32_matmul_precision("highest")
    b.cudnn.allow_tf32 = True
    if NEW_API:
        for module in (b, b.cuda.matmul, b.mkldnn, b.mkldnn.matmul):
            module.fp32_precision = "none"


@pytest.fixture(autouse=True)
def fresh_flags():
    """Each test starts from, and leaves, PyTorch's defaults: the flags are process-wide."""
    pytorch_defaults()
    yield
    pytorch_defaults()


# the caller's own settings, non-default ones included, through either of torch's APIs
CALLERS = {
    "defaults": [],
    "legacy flags flipped": ["b.cuda.matmul.allow_tf32 = True", "b.cudnn.allow_tf32 = False"],
    "matmul precision medium": ["torch.set_float32_matmul_precision('medium')"],
    "new API, matmul tf32": ["b.cuda.matmul.fp32_precision = 'tf32'"],
    "new API, everything tf32": ["b.fp32_precision = 'tf32'"],
    "new API, convolutions ieee": ["b.cudnn.conv.fp32_precision = 'ieee'"],
    "both APIs mixed": ["torch.set_float32_matmul_precision('high')", "b.cuda.matmul.allow_tf32 = False"],
}


def set_caller(name):
    if "new API" in name or "mixed" in name:
        if not NEW_API:
            pytest.skip("torch < 2.9 has no fp32_precision")
    for statement in CALLERS[name]:
        exec(statement)


@pytest.mark.parametrize("name", precisions.PRECISIONS)
def test_applied_sets_both_flags(name):
    tf32 = name != "fp32-strict"
    with precisions.applied(name):
        assert flags() == (tf32, tf32)
        assert torch.get_float32_matmul_precision() == ("high" if tf32 else "highest")
        if NEW_API:
            for module in (b.cuda.matmul, b.cudnn.conv, b.cudnn.rnn):  # "none" and "ieee" are both IEEE
                assert (module.fp32_precision == "tf32") == tf32


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("name", ["fp32", "fp32-strict"])
def test_the_callers_settings_come_back(caller, name):
    set_caller(caller)
    before = settings()
    with precisions.applied(name):
        assert flags() == (name == "fp32",) * 2  # the legacy getters read, whatever the caller mixed
    assert settings() == before
    with pytest.raises(KeyError), precisions.applied(name):
        raise KeyError("a failure inside")
    assert settings() == before
    with precisions.applied("fp32-strict"), precisions.applied("fp32"):  # nested: each gives back its caller's
        assert flags() == (True, True)
    assert settings() == before


@needs_new_api
@pytest.mark.parametrize("name, later", [("fp32", "tf32"), ("fp32", "ieee"), ("fp32-strict", "tf32")])
def test_a_later_global_fp32_precision_reaches_what_it_would_have(name, later):
    """Settings the caller left to inherit torch.backends.fp32_precision still inherit it after
    the block. (Not after fp32-strict then "ieee": torch cannot write back its initial cuDNN
    setting, TF32 unless that global says otherwise; fp32-strict leaves it at TF32.)"""
    with precisions.applied(name):
        pass
    b.fp32_precision = later
    after_the_block = settings()
    pytorch_defaults()
    b.fp32_precision = later
    assert after_the_block == settings()


def test_unknown_precisions_name_the_argument():
    message = r"precision: unknown 'fp64'; expected one of \['fp32', 'fp32-strict', 'bf16', 'fp16'\]"
    for call in (precisions.check, precisions.autocast_dtype, precisions.uses_tf32):
        with pytest.raises(ValueError, match=message):
            call("fp64")
    with pytest.raises(ValueError, match=message):
        with precisions.applied("fp64"):
            pass
    with pytest.raises(ValueError, match=message):
        Trainer(nn.Linear(16, 4), make_splits(), torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1),
                epochs=1, precision="fp64")


def test_autocast_dtypes():
    assert [precisions.autocast_dtype(n) for n in precisions.PRECISIONS] == [None, None, torch.bfloat16,
                                                                            torch.float16]


def test_the_kernels_tf32_choice_follows_the_policy():
    cuda = SimpleNamespace(is_cuda=True)  # tf32_matmuls reads only this of its tensor
    with precisions.applied("fp32"):
        assert tf32_matmuls(cuda) and not tf32_matmuls(torch.ones(1))  # TF32 is a GPU matter
    with precisions.applied("fp32-strict"):
        assert not tf32_matmuls(cuda)
    assert not tf32_matmuls(cuda)  # PyTorch's default: IEEE matmuls


@needs_new_api
def test_the_kernels_tf32_choice_reads_the_newer_api_without_raising():
    b.cuda.matmul.fp32_precision = "tf32"  # allow_tf32 now raises (legacy and new API mixed)
    with pytest.raises(RuntimeError):
        b.cuda.matmul.allow_tf32
    assert tf32_matmuls(SimpleNamespace(is_cuda=True))


# ---- Trainer / fit ----

class Recording(nn.Module):
    """A linear readout of the mean input that notes the flags and autocast at every forward."""

    def __init__(self, features=16, classes=4):
        super().__init__()
        self.fc = nn.Linear(features, classes)
        self.seen = set()

    def forward(self, x):
        self.seen.add((self.training, flags(), torch.is_autocast_enabled("cpu")))
        return self.fc(x.mean(0))


def recording_trainer(precision):
    checkpoint.seed_everything(0)
    model = Recording()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Trainer(model, make_splits(n_train=64, n_test=32), opt, epochs=1, batch_size=32,
                   precision=precision, progress=False)


@pytest.mark.parametrize("name, inside", [("fp32", (True, True)), ("fp32-strict", (False, False)),
                                          ("bf16", (True, True))])
def test_fit_applies_the_precision_and_restores_the_callers_flags(name, inside):
    b.cuda.matmul.allow_tf32 = name == "fp32-strict"  # the caller's flag, unlike the one fit sets
    before = settings()
    trainer = recording_trainer(name)
    trainer.fit()
    autocast = name == "bf16"
    assert trainer.model.seen == {(True, inside, autocast), (False, inside, autocast)}  # train and eval
    assert settings() == before
    trainer.model.seen.clear()
    trainer.evaluate()  # called alone
    assert trainer.model.seen == {(False, inside, autocast)}
    assert settings() == before


def test_a_failing_fit_restores_the_callers_flags():
    before = settings()
    trainer = recording_trainer("fp32")

    def fail(x):
        raise ArithmeticError("inside fit")
    trainer.forward = fail
    with pytest.raises(ArithmeticError):
        trainer.fit()
    assert settings() == before


# ---- spikefuse train ----

QUICK = ["--dataset", "standin", "--epochs", "1", "--batch-size", "64", "--quiet"]


@pytest.fixture
def steps(monkeypatch):
    """The flags every training step ran under, by whichever path built the Trainer."""
    install(monkeypatch.setattr)
    import spikefuse.data as data
    standin = data.load  # takes no progress= (the CLI's --quiet): irrelevant here
    monkeypatch.setattr(data, "load", lambda name, progress=True, **options: standin(name, **options))
    seen = set()
    step = Trainer._train_step

    def recording(self, x, y):
        seen.add(flags())
        return step(self, x, y)
    monkeypatch.setattr(Trainer, "_train_step", recording)
    return seen


@pytest.mark.parametrize("name", ["fp32", "fp32-strict"])
def test_fit_and_the_cli_apply_the_same_flags(name, steps, tmp_path):
    before = settings()
    assert main(["train", *QUICK, "--precision", name, "--out", str(tmp_path / "run")]) == 0
    assert settings() == before
    by_cli = set(steps)
    steps.clear()
    recording_trainer(name).fit()
    assert by_cli == set(steps) == {(name == "fp32",) * 2}


def test_cli_refuses_an_unknown_precision_in_one_line(capsys):
    assert main(["train", "--precision", "fp64"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "unknown precision 'fp64'; expected one of: fp32, fp32-strict, bf16, fp16" in err


def test_cli_help_says_what_each_precision_means(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "fp32-strict" in out and out.count("TF32") == 1
