"""The plan: derived numbers and the contracts between blocks, one test per check."""

from __future__ import annotations

import pytest

from blocks.core import jobs
from blocks.core.environment import Environment
from blocks.spec.errors import PlanError

CPU = Environment(gpus=0)
GPU = Environment(gpus=8)


def plan(*overrides: str, env: Environment = CPU):
    return jobs.plan(list(overrides), env)


def error_keys(p) -> list[str]:
    return [problem.key for problem in p.errors]


def test_derived_batch_arithmetic() -> None:
    p = plan(
        "recipe=blobs",
        "data.batch_size=16",
        "optim.accumulate=4",
        "data.samples=10000",
        "data.val_fraction=0.2",
    )
    d = p.derived
    assert (d.world_size, d.micro_batch, d.accumulate, d.global_batch) == (1, 16, 4, 64)
    assert (d.train_samples, d.val_samples) == (8000, 2000)
    assert d.steps_per_epoch == 8000 // 64
    assert d.total_steps == 3 * d.steps_per_epoch  # the recipe trains 3 epochs
    assert d.epochs == pytest.approx(3.0)


def test_global_batch_derives_accumulation() -> None:
    p = plan("recipe=blobs", "data.batch_size=8", "optim.global_batch=64")
    assert p.ok and (p.derived.accumulate, p.derived.global_batch) == (8, 64)
    ddp = plan(
        "recipe=blobs", "data.batch_size=8", "optim.global_batch=64", "strategy=ddp", "trainer.devices=2"
    )
    assert (ddp.derived.accumulate, ddp.derived.global_batch) == (4, 64)
    bad = plan(
        "recipe=blobs", "data.batch_size=8", "optim.global_batch=60", "strategy=ddp", "trainer.devices=2"
    )
    problem = next(x for x in bad.errors if x.check == "global-batch-divisible")
    assert problem.key == "optim.global_batch" and "optim.global_batch=48 or 64" in problem.fix


def test_max_steps_and_max_epochs_stop_at_whichever_comes_first() -> None:
    p = plan("recipe=blobs", "trainer.max_steps=10", "trainer.max_epochs=5")
    assert p.derived.total_steps == 10
    q = plan("recipe=blobs", "trainer.max_steps=100000", "trainer.max_epochs=1")
    assert q.derived.total_steps == q.derived.steps_per_epoch


def test_overfit_batches_make_an_epoch_and_the_validation_set() -> None:
    p = plan("recipe=blobs", "data.batch_size=512", "trainer.overfit_batches=2")  # 3 epochs
    d = p.derived
    assert p.ok and d.train_samples // d.global_batch == 7
    assert (d.steps_per_epoch, d.total_steps, d.epochs) == (2, 6, 3.0)
    assert d.val_samples == 2 * 512  # validation reads the same batches
    small = plan("recipe=blobs", "data.batch_size=2048", "trainer.overfit_batches=5").derived
    assert (small.steps_per_epoch, small.val_samples) == (1, small.train_samples)  # as many as there are


def test_accelerator_auto_resolves_from_the_environment() -> None:
    assert plan(env=CPU).derived.accelerator == "cpu"
    assert plan(env=GPU).derived.accelerator == "gpu"


def test_text_data_counts_windows_from_the_corpus_size() -> None:
    p = plan("data.seq_len=100", "model.context=128")
    train = p.derived.train_samples
    assert train > 1000
    assert plan("data.seq_len=50", "model.context=128").derived.train_samples == pytest.approx(
        2 * train, rel=0.01
    )


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (("optim.lr=-1",), "optim.lr"),
        (("optim.lr=0",), "optim.lr"),
        (("data.batch_size=0",), "data.batch_size"),
        (("optim.accumulate=0",), "optim.accumulate"),
        (("optim.schedule=cosin",), "optim.schedule"),
        (("model.n_heads=5",), "model.n_heads"),
        (("model.dropout=1.5",), "model.dropout"),
        (("data.level=word",), "data.level"),
        (("data.val_fraction=1.0",), "data.val_fraction"),
        (("trainer.max_steps=null", "trainer.max_epochs=null"), "trainer.max_steps"),
        (("trainer.devices=0",), "trainer.devices"),
        (("trainer.accelerator=tpu",), "trainer.accelerator"),
        (("monitor.log_every_n_steps=0",), "monitor.log_every_n_steps"),
        (("checkpoint.keep_last=0",), "checkpoint.keep_last"),
        (("recipe=blobs", "model.activation=relu6"), "model.activation"),
        (("recipe=blobs", "data.num_classes=1"), "data.num_classes"),
    ],
)
def test_out_of_range_values_name_their_key(overrides: tuple[str, ...], key: str) -> None:
    p = plan(*overrides)
    assert key in error_keys(p), [x.render() for x in p.problems]
    problem = next(x for x in p.errors if x.key == key)
    assert problem.fix


def test_data_model_batch_contract() -> None:
    p = plan("model=mlp")
    (problem,) = p.errors
    assert problem.key == "model" and problem.check == "data-model-batch"
    assert "text" in problem.message and "TokenBatch" in problem.message


def test_data_task_batch_contract() -> None:
    p = plan("task=classify")
    assert any(x.check == "data-task-batch" and x.key == "task" for x in p.errors)


def test_sequence_length_must_fit_the_model_context() -> None:
    p = plan("data.seq_len=512")
    problem = next(x for x in p.errors if x.check == "seq-len-context")
    assert problem.key == "model.context"
    assert "model.context=512" in problem.fix


def test_explicit_vocab_smaller_than_the_data() -> None:
    assert "model.vocab_size" in error_keys(plan("model.vocab_size=100"))
    assert plan("model.vocab_size=300").ok


def test_precision_needs_a_matching_accelerator() -> None:
    p = plan("precision=16-mixed")
    problem = next(x for x in p.errors if x.check == "precision-accelerator")
    assert problem.key == "precision"
    assert plan("precision=16-mixed", env=GPU).ok
    assert plan("precision=bf16-mixed").ok


def test_single_strategy_runs_one_process() -> None:
    p = plan("trainer.devices=4")
    assert any(x.check == "strategy-world-size" for x in p.errors)


def test_global_batch_must_fit_the_training_split() -> None:
    p = plan("recipe=blobs", "data.samples=100", "data.batch_size=128")
    problem = next(x for x in p.errors if x.check == "global-batch-fits-data")
    assert problem.key == "data.batch_size"
    assert "optim.accumulate" in problem.related


def test_an_empty_training_split_is_an_error(tmp_path) -> None:
    (tmp_path / "tiny.txt").write_text("twelve bytes")
    p = plan(f"data.path={tmp_path}/tiny.txt")
    assert any(x.check == "training-split" and x.key == "data" for x in p.errors)


def test_nonsense_sizes_are_problems_not_crashes() -> None:
    assert "data.seq_len" in error_keys(plan("data.seq_len=0"))
    assert "model.d_model" in error_keys(plan("model.d_model=-10"))


def test_validation_needs_a_validation_split() -> None:
    p = plan("recipe=blobs", "data.val_fraction=0", "trainer.val_every=10")
    assert "trainer.val_every" in error_keys(p)


def test_missing_corpus_is_an_error_on_data_path(tmp_path) -> None:
    p = plan(f"data.path={tmp_path}/*.txt")
    assert "data.path" in error_keys(p)


def test_any_fsspec_url_is_a_corpus() -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/corpus/a.txt", b"hello world " * 2000)
    p = plan("data.path=memory://corpus/*.txt", "data.seq_len=64", "model.context=64")
    assert p.ok
    assert p.derived.train_samples == (int(24000 * 0.9) - 1) // 64


def test_the_corpus_files_fsspec_lists_are_the_ones_read_without_it(tmp_path) -> None:
    import fsspec

    from blocks.data import corpus

    def fsspec_files(url: str) -> list[str]:
        fs, _, paths = fsspec.get_fs_token_paths(url)
        return sorted(p for p in paths if fs.isfile(p))

    # The default corpus is walked, not globbed: the same files fsspec lists for its glob.
    default = fsspec_files(corpus.default_corpus_glob())
    assert len(default) > 10 and list(corpus.corpus_files("")) == default
    fs = fsspec.filesystem("file")
    assert corpus.corpus_bytes("") == b"\n".join(fs.cat_file(p) for p in default)
    # A path without '*' is one file, taken literally as fsspec takes it: '[3]' and '?' match nothing else.
    for name in ("run[3]/c.txt", "run3/c.txt", "f?.txt", "fa.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    for url in (f"{tmp_path}/run[3]/c.txt", f"file://{tmp_path}/f?.txt", f"{tmp_path}/run3"):
        assert list(corpus.corpus_files(url)) == fsspec_files(url), url
        assert corpus.corpus_size_bytes(url) == sum(len(fs.cat_file(p)) for p in fsspec_files(url))


def test_char_level_vocabulary_comes_from_the_corpus(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("abcabc" * 3000)
    p = plan(f"data.path={tmp_path}/a.txt", "data.level=char", "data.seq_len=32", "model.context=32")
    assert p.ok
    assert p.data.batch_spec().vocab_size == 3


def test_warmup_longer_than_training_is_a_warning() -> None:
    p = plan("trainer.max_steps=10", "optim.warmup_steps=50")
    assert p.ok
    assert any(x.key == "optim.warmup_steps" for x in p.warnings)


def test_raise_for_errors_carries_every_error() -> None:
    p = plan("optim.lr=-1", "data.batch_size=0")
    with pytest.raises(PlanError) as info:
        p.raise_for_errors()
    assert {x.key for x in info.value.problems} == {"optim.lr", "data.batch_size"}


def test_plan_json_round_trips() -> None:
    import json

    data = json.loads(json.dumps(plan().to_json()))
    assert data["valid"] is True
    assert data["recipe"] == "charlm"
    assert data["blocks"]["model"]["block"] == "transformer"
    assert data["derived"]["global_batch"] == 32
