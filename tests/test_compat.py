"""The private APIs of torch, Lightning, Hydra and OmegaConf: only in ``blocks.compat``, each behaviour pinned.

An upgrade that renames or changes one of them fails here, in one named test, instead of in
a user's job.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

import blocks
from blocks.compat import hydra_private
from tests.conftest import call_in_fresh_process

PACKAGE = Path(blocks.__file__).parent


def private_uses(path: Path) -> list[str]:
    """Imports of private modules or names of other packages, and ``._name`` on anything but ``self``/``cls``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            if node.module.split(".")[0] == "blocks":
                continue
            names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if any(part.startswith("_") for part in node.module.split(".")) or names:
                found.append(f"{path}:{node.lineno}: from {node.module} import {', '.join(names) or '...'}")
        elif isinstance(node, ast.Import):
            found += [
                f"{path}:{node.lineno}: import {a.name}"
                for a in node.names
                if any(part.startswith("_") for part in a.name.split("."))
            ]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if node.attr == "_exit" or (isinstance(root, ast.Name) and root.id in ("self", "cls")):
                continue  # os._exit is public (see the entry points); our own objects' privates are ours
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_private_api_outside_the_compat_package() -> None:
    offenders = [
        use
        for path in sorted(PACKAGE.rglob("*.py"))
        if "compat" not in path.relative_to(PACKAGE).parts
        for use in private_uses(path)
    ]
    assert offenders == []


def test_the_grep_finds_a_private_use(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from hydra._internal.utils import get_args_parser\nfrom torch.x import _hidden\nnode._get_node('a')\n"
    )
    assert len(private_uses(sample)) == 3


# --- Hydra and OmegaConf ------------------------------------------------------------------------


def test_hydra_args_parser_reads_hydra_flags_and_overrides() -> None:
    parsed = hydra_private.hydra_args_parser().parse_args(["-m", "a=1", "--config-dir", "x"])
    assert (parsed.multirun, parsed.overrides, parsed.config_dir) == (True, ["a=1"], "x")


def test_hydra_config_loader_lists_hydra_plugin_options(tmp_path: Path) -> None:
    from hydra.core.object_type import ObjectType

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text("width: 1\n")
    loader = hydra_private.hydra_config_loader([("blocks", f"file://{tmp_path}")])
    assert "basic" in loader.get_group_options("hydra/launcher", results_filter=ObjectType.CONFIG)
    assert "mine" in loader.get_group_options("model", results_filter=ObjectType.CONFIG)


def test_split_sweep_gives_every_job_in_one_batch() -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(["a=1,2", "b=x"])
    assert hydra_private.split_sweep(parsed) == [[["a=1", "b=x"], ["a=2", "b=x"]]]


def test_resolver_calls_are_read_with_omegaconfs_grammar() -> None:
    calls = hydra_private.resolver_calls
    assert calls("${ oc.env :X}", "oc.env") == ["${ oc.env :X}"]
    assert calls("a/${oc.decode:${oc.env:X,d}}/b", "oc.env") == ["${oc.env:X,d}"]
    assert calls("\\${oc.env:X} ${oc.envy:X} oc.env", "oc.env") == []  # escaped, another resolver, text
    assert calls("${oc.env:X", "oc.env") is None


def test_config_header_reads_the_package_line() -> None:
    assert hydra_private.config_header("# @package _global_\nx: 1\n")["package"] == "_global_"


def test_config_child_is_the_unresolved_node() -> None:
    cfg = OmegaConf.create({"kwargs": {"depth": 2}, "ref": "${kwargs.depth}"})
    child = hydra_private.config_child(cfg, "kwargs")
    assert isinstance(child, DictConfig)
    OmegaConf.set_struct(cfg, True)
    OmegaConf.set_struct(child, False)
    cfg.kwargs.width = 3  # the child itself, not a copy
    assert cfg.kwargs.width == 3


@pytest.fixture()
def conf_dir(tmp_path: Path) -> Path:
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "a.yaml").write_text("port: 1\n")
    (tmp_path / "cfg.yaml").write_text("defaults:\n  - db: ???\n  - _self_\nx: 1\n")
    return tmp_path


def compose_error(conf_dir: Path, overrides: list[str]) -> Exception:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir)):
            compose("cfg", overrides=overrides)
    except Exception as exc:
        return exc
    finally:
        GlobalHydra.instance().clear()
    raise AssertionError(f"{overrides} composed")


def test_hydra_messages_still_name_what_the_translation_reads(conf_dir: Path) -> None:
    missing = compose_error(conf_dir, [])
    match = hydra_private.hydra_message("missing_group", str(missing))
    assert match and match.group(1) == "db"
    unknown = compose_error(conf_dir, ["db=a", "y.z=1"])
    match = hydra_private.hydra_message("could_not_override", str(unknown))
    assert match and match.group(1) == "y.z"
    match = hydra_private.hydra_message("full_key", str(unknown.__cause__))
    assert match and match.group(1) == "y"
    sweep = compose_error(conf_dir, ["db=a", "x=1,2"])
    assert hydra_private.hydra_message("sweep_without_multirun", str(sweep))

    @dataclass
    class Typed:
        n: int = 1

    typed = OmegaConf.structured(Typed)
    with pytest.raises(Exception) as info:
        typed.n = "abc"
    match = hydra_private.hydra_message("converted", str(info.value))
    assert match and match.group(1) == "Integer"


# --- torch and Lightning ------------------------------------------------------------------------


def quiet_trainer(**kwargs: Any) -> Any:
    """A CPU Lightning Trainer that writes no checkpoints, progress bar or model summary."""
    import pytorch_lightning as pl

    return pl.Trainer(
        accelerator="cpu",
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def test_dcp_round_trip_through_the_fsspec_reader_and_writer(tmp_path: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    from blocks.compat import dcp_private

    state = {"model": {"w": torch.arange(4.0)}, "step": 3}
    dcp.save(state, storage_writer=dcp_private.FsspecWriter(str(tmp_path)), no_dist=True)
    reader = dcp_private.FsspecReader(str(tmp_path))
    assert str(dcp_private.dcp_metadata_path(reader, None)).endswith("/.metadata")
    assert Path(str(dcp_private.dcp_metadata_path(reader, None))).exists()
    loaded = dcp_private.dcp_load_everything(dcp_private.FsspecReader(str(tmp_path)))
    assert torch.equal(loaded["model"]["w"], torch.arange(4.0)) and loaded["step"] == 3


def test_activation_checkpointed_keeps_the_layer_output() -> None:
    import torch

    from blocks.compat import torch_private

    layer = torch.nn.Linear(3, 3)
    wrapped = torch_private.activation_checkpointed(layer)
    x = torch.randn(2, 3, requires_grad=True)
    assert torch.allclose(wrapped(x), layer(x))


def test_compile_in_place_traces_a_torch_nn_forward_and_copies_drop_it() -> None:
    """``nn.Sequential`` (forward in torch.nn, no hooks) compiles; names and copies stay the eager module's."""
    import copy

    import torch
    from torch._dynamo.utils import counters

    from blocks.compat import torch_private

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    names = list(model.state_dict())
    torch_private.compile_in_place(model, backend="eager")
    torch._dynamo.reset()
    counters.clear()
    x = torch.randn(2, 3)
    assert torch.equal(model(x), model.forward(x))
    assert counters["stats"]["unique_graphs"] == 1
    assert list(model.state_dict()) == names
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone[0].weight.zero_()
    assert not torch.equal(clone(x), model(x)), "the copy computes with its own weights"

    # Regression: every model compiled in a process shared one function, so one recompile budget
    # (torch._dynamo.config.recompile_limit): an in-process sweep over architectures ran eagerly from
    # its fourth job on, without a word. Each model now has its own.
    limit = torch._dynamo.config.recompile_limit
    for width in range(1, limit + 3):
        other = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))
        torch_private.compile_in_place(other, backend="eager")
        counters.clear()
        other(x)
        assert counters["stats"]["unique_graphs"] == 1, f"model {width} ran eagerly"


def test_compile_forwards_in_place_leaves_later_hooks_outside_and_copies_keep_their_weights() -> None:
    """Two ``nn.Sequential`` units share one graph; a dynamo-disabled hook added after (as FSDP2's) breaks nothing."""
    import copy
    import pickle

    import torch
    from torch._dynamo.utils import counters

    from blocks.compat import torch_private

    torch.manual_seed(0)
    units = [torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()) for _ in range(2)]
    names = [list(unit.state_dict()) for unit in units]
    torch_private.compile_forwards_in_place(units, backend="eager")
    assert pickle.loads(pickle.dumps(units[0])).forward.__func__ is torch.nn.Sequential.forward, "eager"
    calls = []
    for unit in units:
        unit.register_forward_pre_hook(torch._dynamo.disable(lambda module, args: calls.append(module)))
    torch._dynamo.reset()
    counters.clear()
    x = torch.randn(2, 3)
    for unit in units:
        assert torch.equal(unit(x), torch.nn.Sequential.forward(unit, x))
    assert calls == units, "the hooks ran, outside the graph"
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert [list(unit.state_dict()) for unit in units] == names
    clone = copy.deepcopy(units[0])
    with torch.no_grad():
        clone[0].weight.zero_()
    assert not torch.equal(clone(x), units[0](x)), "the copy computes with its own weights"
    limit = torch._dynamo.config.recompile_limit
    for width in range(1, limit + 3):  # each model its own recompile budget, as compile_in_place's
        other = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))
        torch_private.compile_forwards_in_place([other], backend="eager")
        counters.clear()
        other(x)
        assert counters["stats"]["unique_graphs"] == 1, f"model {width} ran eagerly"


def test_lightning_progress_and_signal_seams(tmp_path: Path) -> None:
    import signal

    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from blocks.compat import torch_private

    seen: list[int] = []
    handled: list[object] = []
    hook_names: list[object] = []

    class Tiny(torch_private.DirectHookNameWrites, pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            seen.append(torch_private.processed_micro_batches(self.trainer))
            handled.append(signal.getsignal(signal.SIGTERM))
            hook_names.append(vars(self).get("_current_fx_name"))  # written by the dispatcher, directly
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_save_checkpoint(self, checkpoint):  # type: ignore[no-untyped-def]
            progress = torch_private.saved_batch_progress(checkpoint)
            assert progress is not None and set(progress) >= {"total", "current"}
            epochs = torch_private.saved_epoch_progress(checkpoint)
            counters = {"ready", "started", "processed", "completed"}
            assert epochs is not None and counters <= set(epochs["current"])

    def handler(signum: int, frame: object) -> None:
        """Never called; only installed."""

    trainer = quiet_trainer(max_steps=3, logger=False, default_root_dir=str(tmp_path))
    torch_private.replace_signal_handlers(trainer, handler, (signal.SIGTERM,))
    data = DataLoader(TensorDataset(torch.randn(6, 2)), batch_size=2)
    trainer.fit(Tiny(), train_dataloaders=data)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    assert seen == [0, 1, 2]
    assert handled and all(h is handler for h in handled)
    assert hook_names == ["training_step"] * 3  # Lightning names the running hook in _current_fx_name


@pytest.mark.parametrize("fused", [True, False])
def test_lightning_leaves_a_fused_optimizers_gradients_scaled_before_its_step(
    tmp_path: Path, fused: bool
) -> None:
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.plugins.precision import MixedPrecision
    from torch.utils.data import DataLoader, TensorDataset

    from blocks.compat import torch_private

    seen: list[tuple[float | None, float, float]] = []  # helper's scale, scaler's scale, grad norm

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.AdamW(self.parameters(), lr=0.1, fused=fused)

        def on_before_optimizer_step(self, optimizer):  # type: ignore[no-untyped-def]
            scale = torch_private.loss_scale_in_gradients(self.trainer, optimizer)
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in self.parameters()]))
            seen.append(
                (
                    None if scale is None else float(scale),
                    self.trainer.precision_plugin.scaler.get_scale(),
                    float(norm),
                )
            )

    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    trainer = quiet_trainer(max_steps=1, logger=False, plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    data = DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)
    trainer.fit(Tiny(), train_dataloaders=data)
    ((scale, scaler_scale, norm),) = seen
    unscaled = 2 * math.sqrt(3)  # d(sum over 2 rows of ones)/d(weight, bias): 2 for each of the 3
    if fused:  # unscaled inside the optimizer's step: the hook sees the scaled gradients
        assert scale == scaler_scale == 1024.0 and norm == pytest.approx(1024.0 * unscaled)
    else:
        assert scale is None and norm == pytest.approx(unscaled)


BATCH_HOOK_OWNERS = ("nobody", "module", "datamodule")


@pytest.mark.parametrize("owner", BATCH_HOOK_OWNERS)
def test_a_batch_reaches_the_step_through_the_batch_hooks_only_when_one_is_overridden(
    tmp_path: Path, owner: str
) -> None:
    """Lightning's three batch hooks cost three dispatches a step; they are skipped only while no one overrides them."""
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.profilers import PassThroughProfiler
    from torch.utils.data import DataLoader, TensorDataset

    from blocks.compat import torch_private

    class CountingProfiler(PassThroughProfiler):
        def __init__(self) -> None:
            super().__init__()
            self.actions: list[str] = []

        def start(self, action_name: str) -> None:
            self.actions.append(action_name)

    def doubled(batch: Any, dataloader_idx: int) -> Any:
        return [batch[0] * 2]

    stepped: list[torch.Tensor] = []

    class Tiny(torch_private.DirectBatchTransfer, pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            stepped.append(batch[0])
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Doubling(Tiny):
        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return doubled(batch, dataloader_idx)

    inputs = torch.arange(12, dtype=torch.float32).reshape(6, 2)

    class Data(pl.LightningDataModule):
        def train_dataloader(self) -> Any:
            return DataLoader(TensorDataset(inputs), batch_size=2)

    class DoublingData(Data):
        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return doubled(batch, dataloader_idx)

    profiler = CountingProfiler()
    trainer = quiet_trainer(max_steps=3, logger=False, default_root_dir=str(tmp_path), profiler=profiler)
    module = Doubling() if owner == "module" else Tiny()
    trainer.fit(module, datamodule=DoublingData() if owner == "datamodule" else Data())
    expected = inputs if owner == "nobody" else inputs * 2
    assert torch.equal(torch.cat(stepped), expected)
    dispatched = [action for action in profiler.actions if action.endswith(torch_private.BATCH_HOOKS)]
    assert len(dispatched) == (0 if owner == "nobody" else 3 * len(torch_private.BATCH_HOOKS)), dispatched


def test_a_dict_of_tensors_moves_as_lightnings_move_data_to_device_moves_it() -> None:
    """The short path for blocks' batches gives what Lightning's walk gives; anything else takes the walk."""
    import torch
    from lightning_fabric.utilities.apply_func import move_data_to_device

    from blocks.compat.torch_private import tensors_to_device

    batch = {"inputs": torch.randn(4, 3), "targets": torch.arange(4)}
    for device in (torch.device("cpu"), "cpu"):
        moved, expected = tensors_to_device(batch, device), move_data_to_device(batch, device)
        assert type(moved) is dict and moved is not batch and moved.keys() == expected.keys()
        assert all(moved[k] is expected[k] for k in moved), "a tensor already there is the same tensor"
    nested = {"inputs": [torch.ones(2)], "meta": "kept"}
    moved_nested = tensors_to_device(nested, torch.device("cpu"))
    assert moved_nested["meta"] == "kept" and torch.equal(moved_nested["inputs"][0], torch.ones(2))


def test_hydra_completion_answers_a_group_and_its_options() -> None:
    from hydra import initialize
    from hydra.core.global_hydra import GlobalHydra

    from blocks.compat.hydra_private import hydra_completion
    from blocks.core import catalog
    from blocks.core.compose import PRIMARY_CONFIG

    catalog.load()
    GlobalHydra.instance().clear()
    with initialize(version_base="1.3", config_path=None, job_name="blocks"):
        loader = GlobalHydra.instance().hydra.config_loader  # type: ignore[union-attr]
        assert "optim=adamw" in hydra_completion(loader, PRIMARY_CONFIG, "optim=")
        assert any(c.startswith("optim.lr=") for c in hydra_completion(loader, PRIMARY_CONFIG, "optim.l"))


def test_skipping_automatic_hyperparameters_keeps_lightning_from_logging_them(tmp_path: Path) -> None:
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    from blocks.compat import torch_private

    class Tiny(pl.LightningModule):
        def __init__(self, width: int = 2) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(width, 1)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(skip: bool, name: str) -> Path:
        logger = CSVLogger(tmp_path, name=name)
        module = Tiny()
        if skip:
            torch_private.skip_automatic_hyperparameters(module)
        trainer = quiet_trainer(max_steps=1, logger=logger)
        trainer.fit(module, train_dataloaders=DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2))
        return Path(logger.log_dir) / "hparams.yaml"

    assert "width" in fit(False, "logged").read_text()
    skipped = fit(True, "skipped")
    assert not skipped.exists() or "width" not in skipped.read_text()


class FullDisk:
    """A binary file that takes *room* bytes, then fails like a full disk; closed, it refuses every write."""

    def __init__(self, room: int) -> None:
        self.room, self.closed = room, False

    def write(self, data: bytes) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        if len(data) > self.room:
            raise OSError(28, "No space left on device")
        self.room -= len(data)
        return len(data)

    def flush(self) -> None:
        """Nothing buffered."""


def save_into_a_full_disk_then_collect() -> str:
    """A save that fails midway, its file closed, then garbage collection; what the save raised."""
    import gc

    import torch

    from blocks.compat.torch_private import save_without_zip_crc

    disk = FullDisk(room=4000)
    try:
        save_without_zip_crc({"weight": torch.randn(10_000)}, disk)  # type: ignore[arg-type]
    except OSError as exc:
        raised = str(exc)
    disk.closed = True
    gc.collect()  # frees the writer the traceback kept; unfinished, its destructor aborted the process
    return raised


def test_a_save_that_fails_midway_leaves_no_writer_to_abort_the_process_later() -> None:
    """Regression: a failed checkpoint write SIGABRTed the process at a later garbage collection."""
    assert "No space left" in call_in_fresh_process(save_into_a_full_disk_then_collect)


def test_a_whole_interpolation_is_told_from_text_around_one_with_omegaconfs_grammar() -> None:
    whole = hydra_private.is_whole_interpolation
    assert whole("${stash}") and whole("${oc.select:a.b}") and whole("${oc.create:{a: 1}}")
    assert not whole("a${b}") and not whole("${a}${b}") and not whole("${a}/x.log") and not whole(" ${a}")
    assert not whole("\\${a}") and not whole("${a") and not whole("plain")


def stop_signals_torchrun_acts_on() -> list[str]:
    """The signals torchrun's handler raised for, of SIGTERM, SIGTERM, SIGINT, once blocks patched it twice."""
    import signal

    import torch.distributed.elastic.multiprocessing.api as elastic_processes

    from blocks.compat.elastic_private import stop_on_the_first_signal_only

    stop_on_the_first_signal_only()
    stop_on_the_first_signal_only()
    raised = []
    for signum in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT):
        try:
            elastic_processes._terminate_process_handler(signum, None)  # what PContext.start installs
        except elastic_processes.SignalException as exc:
            raised.append(exc.sigval.name)
    return raised


def test_torchrun_acts_on_its_first_stop_signal_only() -> None:
    """Regression: a second SIGTERM (a whole job signalled: torchrun's own, then the driver's) aborted
    torchrun's shutdown of the workers, and the workers died with it before they saved."""
    import inspect

    import torch.distributed.elastic.multiprocessing.api as elastic_processes

    assert "_terminate_process_handler" in inspect.getsource(elastic_processes.PContext.start)  # read by name
    assert call_in_fresh_process(stop_signals_torchrun_acts_on) == ["SIGTERM"]


def test_a_loader_workers_init_fn_is_called_by_the_loop_that_holds_its_done_event() -> None:
    """The seams of :func:`blocks.runtime.datamodule.outlive_stop_signals` (tests/test_faults_processes.py runs it)."""
    import inspect
    import subprocess

    from torch.utils.data._utils import worker

    assert "done_event" in inspect.signature(worker._worker_loop).parameters
    assert "init_fn(worker_id)" in inspect.getsource(worker._worker_loop)
    assert callable(subprocess.Popen._execute_child)  # type: ignore[attr-defined]
