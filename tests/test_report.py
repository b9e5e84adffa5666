"""``blocks report`` on a run and on sweeps (basic and Optuna), the objective a run returns to Hydra, and run dirs from elsewhere."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import read_summary

pytestmark = pytest.mark.timeout(600)

BLOBS = ["recipe=blobs", "monitor.log_every_n_steps=1", "monitor.progress=off", "trainer.max_steps=6"]
PNG_SIZE = (800, 450)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def table_rows(markdown: str) -> list[list[str]]:
    rows = [line.strip("|").split("|") for line in markdown.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row] for row in rows]


def test_a_run_report_has_plots_and_a_summary(cli_in_process, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert cli_in_process("run", *BLOBS, f"hydra.run.dir={run_dir}").returncode == 0
    result = cli_in_process("report", str(run_dir))
    assert result.returncode == 0, result.output
    report = run_dir / "report"
    for name in ("loss", "throughput", "lr", "grad_norm", "validation"):
        png = report / f"{name}.png"
        assert png.stat().st_size > 5000, name
        assert png_size(png) == PNG_SIZE, name
    markdown = (report / "report.md").read_text()
    summary = dict(row for row in table_rows(markdown) if len(row) == 2)
    assert summary["status"] == "completed" and summary["global_step"] == "6"
    assert float(summary["val/loss"]) == pytest.approx(read_summary(run_dir)["metrics"]["val/loss"], rel=1e-5)
    page = (report / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 6, "every plot is embedded in the HTML"
    # Regression: the table's samples_per_s was the last logging window, under summary.json's name for the whole run.
    recorded = read_summary(run_dir)
    assert float(summary["samples/s (whole run)"]) == pytest.approx(recorded["samples_per_s"], rel=1e-5)
    assert float(summary["samples/s (steady)"]) == pytest.approx(recorded["steady_samples_per_s"], rel=1e-5)
    last_window = float(summary["samples_per_s (last window)"])
    assert last_window == pytest.approx(recorded["metrics"]["samples_per_s"], rel=1e-5)
    assert "samples_per_s" not in summary


def test_a_sweep_report_ranks_every_job_by_the_objective(cli_in_process, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    lrs = ["0.0001", "0.003", "0.03"]
    result = cli_in_process("run", "-m", *BLOBS, f"optim.lr={','.join(lrs)}", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.output[-3000:]
    result = cli_in_process("report", str(sweep))
    assert result.returncode == 0, result.output
    rows = table_rows((sweep / "report" / "report.md").read_text())
    header, jobs = rows[0], rows[1:]
    assert header == ["rank", "job", "status", "optim.lr", "val/loss"]
    assert sorted(row[3] for row in jobs) == sorted(lrs), "a row for every job"
    losses = [float(row[4]) for row in jobs]
    assert losses == sorted(losses) and [row[0] for row in jobs] == ["1", "2", "3"]
    for row in jobs:
        assert float(row[4]) == pytest.approx(read_summary(sweep / row[1])["metrics"]["val/loss"], rel=1e-5)
    plot = sweep / "report" / "objective_vs_optim_lr.png"
    assert png_size(plot) == PNG_SIZE and plot.stat().st_size > 5000
    maximized = cli_in_process("report", str(sweep), "--objective", "val/accuracy", "--mode", "max")
    assert maximized.returncode == 0
    ranked = [float(row[4]) for row in table_rows((sweep / "report" / "report.md").read_text())[1:]]
    assert ranked == sorted(ranked, reverse=True)
    # Regression: a throughput objective ranked the jobs by their last logging window.
    fastest = cli_in_process("report", str(sweep), "--objective", "samples_per_s", "--mode", "max")
    assert fastest.returncode == 0
    for row in table_rows((sweep / "report" / "report.md").read_text())[1:]:
        steady = read_summary(sweep / row[1])["steady_samples_per_s"]
        assert float(row[4]) == pytest.approx(steady, rel=1e-5), "the figure to compare configurations by"
    # Regression: a job that failed after logging (a stall leaves a failed summary without metrics,
    # and its metrics.csv rows) was ranked by its last logged value, above completed jobs.
    best = sweep / jobs[0][1]
    (best / "summary.json").write_text(
        json.dumps({"status": "failed", "reason": "stalled", "global_step": 25})
    )
    assert cli_in_process("report", str(sweep)).returncode == 0
    rows = table_rows((sweep / "report" / "report.md").read_text())[1:]
    assert [(row[0], row[2], row[4]) for row in rows][-1] == ("-", "failed", "-"), rows
    assert [row[0] for row in rows[:2]] == ["1", "2"] and rows[-1][1] == best.name


def test_report_does_not_import_torch(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text('{"status": "completed", "metrics": {"train/loss": 1.0}}')
    (run_dir / "metrics.csv").write_text("step,train/loss,lr\n1,2.0,0.1\n2,1.0,0.1\n")
    code = (
        "import sys; from blocks.cli.main import main\n"
        "try:\n    main(['report', sys.argv[1]])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules and 'pytorch_lightning' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code, str(run_dir)], check=True, capture_output=True)
    assert png_size(run_dir / "report" / "loss.png") == PNG_SIZE


def test_report_of_a_directory_without_runs_is_a_clear_error(cli, tmp_path: Path) -> None:
    result = cli("report", str(tmp_path))
    assert result.returncode == 2
    assert "neither a run dir" in result.output and "Traceback" not in result.output


SCORED = {
    "status": "completed",
    "metrics": {
        "train/loss": 1.0,
        "val/loss": 2.0,
        "val/perplexity": 7.4,
        "test/accuracy": 0.5,
        "samples_per_s": 90.0,
        "mfu": 0.25,
    },
    "samples_per_s": 30.0,
    "steady_samples_per_s": 60.0,
    "tokens_per_s": 3840.0,
    "steady_tokens_per_s": 7680.0,
    "wall_s": 12.0,
    "train_s": 20.0,
}


def test_a_run_summary_shows_every_score_and_names_each_throughput(cli, tmp_path: Path) -> None:
    """The report dropped every validation metric but val/accuracy and val/loss; the report and the
    console showed the last window's throughput as samples_per_s, the whole run's and the steady one nowhere
    (the console's whole-run "samples/s" sat beside the last window's "samples_per_s")."""
    from rich.console import Console

    from blocks.monitor.sinks import summary_table

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps(SCORED))
    assert cli("report", str(run_dir)).returncode == 0
    shown = dict(row for row in table_rows((run_dir / "report" / "report.md").read_text()) if len(row) == 2)
    console = Console(width=200, record=True)
    console.print(summary_table(SCORED))
    cells = [line.strip("│ ").split("│") for line in console.export_text().splitlines() if "│" in line]
    printed = {cell[0].strip(): cell[-1].strip() for cell in cells if len(cell) == 2}
    expected = {
        "val/loss": "2",
        "val/perplexity": "7.4",
        "test/accuracy": "0.5",
        "samples/s (whole run)": "30",
        "samples/s (steady)": "60",
        "tokens/s (whole run)": "3840",
        "tokens/s (steady)": "7680",
        "samples_per_s (last window)": "90",
        "mfu (last window)": "0.25",
    }
    for key, value in expected.items():
        assert shown.get(key) == value, (key, shown)
        assert printed.get(key) == value, (key, printed)
    assert shown["training time (whole run)"] == "20.0 s" and printed["training time (whole run)"] == "20.0s"
    assert shown["wall time (this attempt)"] == "12.0 s" and printed["wall time (this attempt)"] == "12.0s"
    assert "samples_per_s" not in shown and "samples_per_s" not in printed


def test_a_throughput_objective_is_the_steady_figure_else_the_whole_runs() -> None:
    """``monitor.objective=samples_per_s`` gave the sweeper the last logging window's throughput."""
    from types import SimpleNamespace

    from blocks.core.run_files import Summary
    from blocks.launch.driver import objective

    def returned(name: str, mode: str = "min", **figures: object) -> float | None:
        plan = SimpleNamespace(monitor=SimpleNamespace(objective=name, objective_mode=mode))
        return objective(plan, Summary(status="completed", **{"metrics": SCORED["metrics"], **figures}))  # type: ignore[arg-type]

    assert returned("samples_per_s", samples_per_s=30.0, steady_samples_per_s=60.0) == 60.0
    assert returned("samples_per_s", samples_per_s=30.0) == 30.0, "fewer than two windows: the whole run's"
    assert returned("tokens_per_s", tokens_per_s=3840.0, steady_tokens_per_s=7680.0) == 7680.0
    assert returned("val/perplexity") == 7.4 and returned("val/nothing") == 1.0, "else train/loss"
    assert returned("val/nothing", mode="max") is None, "a maximizing sweeper never gets a loss"


def test_a_maximized_objective_ranks_no_job_by_its_training_loss(cli_in_process, tmp_path: Path) -> None:
    """Jobs without ``val/accuracy`` were ranked by ``train/loss`` under ``--mode max``: the worst model first."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for job, loss in (("0", 1.0), ("1", 3.0)):
        small_run_dir(sweep / job)
        (sweep / job / "summary.json").write_text(
            json.dumps({"status": "completed", "metrics": {"train/loss": loss}})
        )
    result = cli_in_process("report", str(sweep), "--mode", "max")
    assert result.returncode == 0, result.output
    rows = table_rows((sweep / "report" / "report.md").read_text())[1:]
    assert [(row[0], row[-1]) for row in rows] == [("-", "-"), ("-", "-")], rows
    minimized = cli_in_process("report", str(sweep))
    assert minimized.returncode == 0, minimized.output
    rows = table_rows((sweep / "report" / "report.md").read_text())[1:]
    assert [(row[0], row[1]) for row in rows] == [("1", "0"), ("2", "1")], "minimized: train/loss stands in"


def small_run_dir(root: Path) -> Path:
    """A run dir as ``blocks report`` reads it: a summary and two rows of metrics, no training."""
    root.mkdir()
    (root / "summary.json").write_text('{"status": "completed", "metrics": {"train/loss": 1.0}}')
    (root / "metrics.csv").write_text("step,train/loss,lr\n1,2.0,0.1\n2,1.0,0.1\n")
    return root


def test_a_run_dir_from_elsewhere_cannot_make_report_write_outside_it_or_build_objects(
    cli_in_process, tmp_path: Path
) -> None:
    """A ``report`` link in a run dir (or a link in place of one of its files) made ``blocks report``
    write, and overwrite, files wherever it pointed; a YAML tag in ``config.yaml`` ended in a traceback."""
    outside, victim = tmp_path / "outside", tmp_path / "victim.txt"
    outside.mkdir()
    victim.write_text("keep me")
    linked = small_run_dir(tmp_path / "linked")
    (linked / "report").symlink_to(outside)
    result = cli_in_process("report", str(linked))
    assert result.returncode == 2 and "Traceback" not in result.output, result.output
    assert "is a link" in result.output and not list(outside.iterdir())

    planted = small_run_dir(tmp_path / "planted")
    (planted / "report").mkdir()
    (planted / "report" / "report.md").symlink_to(victim)
    (planted / "report" / "loss.png").symlink_to(victim)
    assert cli_in_process("report", str(planted)).returncode == 0
    assert victim.read_text() == "keep me"
    assert not (planted / "report" / "report.md").is_symlink() and png_size(planted / "report" / "loss.png")

    tagged = small_run_dir(tmp_path / "tagged")
    (tagged / "config.yaml").write_text(
        f"x: !!python/object/apply:os.system ['touch {tmp_path / 'pwned'}']\n"
    )
    result = cli_in_process("report", str(tagged))
    assert result.returncode == 2 and "Traceback" not in result.output, result.output
    assert "config.yaml is not a file blocks wrote" in " ".join(result.output.split())
    for command in (["eval", str(tagged)], ["export", str(tagged), str(tmp_path / "export")]):
        result = cli_in_process(*command)
        assert result.returncode == 2 and "Traceback" not in result.output, result.output
        assert "config.yaml is not a config blocks wrote" in " ".join(result.output.split())
    assert not (tmp_path / "pwned").exists()


@pytest.mark.slow
def test_an_optuna_sweep_of_four_trials_completes_and_is_ranked(cli_in_process, tmp_path: Path) -> None:
    sweep = tmp_path / "optuna"
    result = cli_in_process(
        "run",
        "-m",
        "hparams_search=optuna",
        *BLOBS,
        "hydra.sweeper.n_trials=4",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.output[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if (p / "summary.json").exists())
    assert jobs == ["0", "1", "2", "3"]
    losses = {job: read_summary(sweep / job)["metrics"]["val/loss"] for job in jobs}
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["best_value"] == pytest.approx(min(losses.values()), rel=1e-6), (
        "Optuna optimized the objective each run returned"
    )
    assert set(results["best_params"]) == {"optim.lr", "optim.weight_decay"}
    assert cli_in_process("report", str(sweep)).returncode == 0
    rows = table_rows((sweep / "report" / "report.md").read_text())[1:]
    assert [row[1] for row in rows] == sorted(losses, key=losses.__getitem__)
    assert rows[0][3] == str(results["best_params"]["optim.lr"])


def test_a_damaged_pipeline_record_is_a_clear_error_and_a_truncated_evaluation_a_marked_row(
    cli_in_process, tmp_path: Path
) -> None:
    """A pipeline.json stage without "does", or an evaluation's truncated metrics.json, made
    ``blocks report`` end in a traceback (IndexError, JSONDecodeError)."""
    root = tmp_path / "pipe"
    root.mkdir()
    small_run_dir(root / "train")
    (root / "train" / "summary.json").write_text(
        '{"status": "completed", "global_step": 2, "state_digest": "ab"}'
    )
    (root / "evaluate").mkdir()
    (root / "evaluate" / "summary.json").write_text('{"status": "completed", "metrics": {}}')
    (root / "evaluate" / "upstream.json").write_text(
        '{"stage": "train", "global_step": 2, "state_digest": "ab"}'
    )
    (root / "evaluate" / "metrics.json").write_text('{"val/loss": 0.1')
    stages = [{"name": "train", "does": "train", "from": None}, {"name": "evaluate", "from": "train"}]
    (root / "pipeline.json").write_text(json.dumps({"stages": stages}))
    result = cli_in_process("report", str(root))
    assert result.returncode == 2 and "Traceback" not in result.output, result.output
    said = " ".join(result.output.split())
    assert (
        "pipeline.json is not the record of its stages" in said
        and "stage 2 (evaluate) has 'does': None" in said
    )
    assert "run the pipeline again" in said

    stages[1]["does"] = "evaluate"
    (root / "pipeline.json").write_text(json.dumps({"stages": stages}))
    result = cli_in_process("report", str(root))
    assert result.returncode == 0, result.output
    rows = {row[0]: row for row in table_rows((root / "report" / "report.md").read_text())}
    assert rows["evaluate"][2] == "completed", rows
    assert rows["evaluate"][4].startswith(f"unreadable: {root / 'evaluate' / 'metrics.json'}"), rows


def small_pipeline_dir(root: Path) -> Path:
    """A pipeline's dir as ``blocks report`` reads it: its record and a train and an evaluate stage."""
    root.mkdir(parents=True)
    small_run_dir(root / "train")
    (root / "train" / "stage.json").write_text('{"stage": "train"}')
    (root / "evaluate").mkdir()
    (root / "evaluate" / "summary.json").write_text('{"status": "completed", "metrics": {}}')
    (root / "evaluate" / "upstream.json").write_text('{"stage": "train", "global_step": 2}')
    stages = [
        {"name": "train", "does": "train", "from": None},
        {"name": "evaluate", "does": "evaluate", "from": "train"},
    ]
    (root / "pipeline.json").write_text(json.dumps({"stages": stages}))
    return root


def test_a_pipeline_below_a_sweep_dir_is_left_out_not_taken_for_an_old_pipeline(
    cli_in_process, tmp_path: Path
) -> None:
    """``blocks report outputs`` with ``outputs/digits_pipeline/`` walked into the pipeline and refused
    ``outputs`` as a pipeline's dir written before pipeline.json, its fix naming an unrelated run dir."""
    outputs = tmp_path / "outputs"
    pipeline = small_pipeline_dir(outputs / "digits_pipeline")
    result = cli_in_process("report", str(outputs))
    assert result.returncode == 2 and "Traceback" not in result.output, result.output
    said = " ".join(result.output.split())
    assert "written before" not in said and f"blocks report {pipeline}" in said, said

    small_run_dir(outputs / "run1")
    result = cli_in_process("report", str(outputs))
    assert result.returncode == 0, result.output
    rows = table_rows((outputs / "report" / "report.md").read_text())
    assert rows[1][1] == "run1" and ["digits_pipeline", f"blocks report {pipeline}"] in rows, rows
    assert len([row for row in rows if row[0] == "1"]) == 1, "the pipeline's stages are no jobs"


def test_only_files_blocks_writes_make_a_job_below_a_sweep_dirs_children(
    cli_in_process, tmp_path: Path
) -> None:
    """Hydra's ``conf/config.yaml`` below a run's dir was a job ``conf`` (status unknown), and the
    ``.hydra`` of a sweep job killed before it wrote its run files was a job ``1/.hydra``; a
    ``conf/config.yaml`` directly in the dir reported was a job too."""
    proj = tmp_path / "proj"
    (proj / "rep").mkdir(parents=True)
    small_run_dir(proj / "rep" / "0")
    (proj / "rep" / "conf").mkdir()
    (proj / "rep" / "conf" / "config.yaml").write_text("defaults: [_self_]\n")
    (proj / "rep" / "1" / ".hydra").mkdir(parents=True)
    (proj / "rep" / "1" / ".hydra" / "config.yaml").write_text("optim: {lr: 0.1}\n")
    small_run_dir(proj / "2")
    (proj / "conf").mkdir()
    (proj / "conf" / "config.yaml").write_text("defaults: [_self_]\n")
    result = cli_in_process("report", str(proj))
    assert result.returncode == 0, result.output
    jobs = [row[1] for row in table_rows((proj / "report" / "report.md").read_text())[1:]]
    assert sorted(jobs) == ["2", "rep/0"], jobs


def test_the_report_of_the_current_dir_is_titled_by_its_name(cli_in_process, tmp_path: Path) -> None:
    """``blocks report .`` titled its report ``# Sweep report:  (...)``: Path('.').name is empty."""
    small_run_dir(tmp_path / "0")
    small_run_dir(tmp_path / "1")
    assert cli_in_process("report", ".").returncode == 0
    title = (tmp_path / "report" / "report.md").read_text().splitlines()[0]
    assert title.startswith(f"# Sweep report: {tmp_path.name} (2 jobs"), title
