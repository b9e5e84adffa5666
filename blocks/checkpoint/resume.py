"""Which checkpoint a run resumes from, and whether it may (torch-free: the driver checks before launching)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from blocks.checkpoint import store
from blocks.spec.errors import BlocksError, Problem
from blocks.spec.restarts import restart_count

if TYPE_CHECKING:
    from blocks.core.plan import Plan
    from blocks.data.base import DataBlock

log = logging.getLogger(__name__)


def checkpoint_dir(plan: Plan, default: str) -> str:
    """The job's checkpoint directory (*default* when ``checkpoint.dir`` is unset)."""
    block = plan.checkpoint
    return block.dir or default


COMPARED = {
    "model": "model",
    "task": "task",
    "data": "data",
    "optim": "optimizer (optim)",
    "seed": "seed (trainer.seed)",
    "data_content": "data content (the files the data block reads changed)",
}
"""What a checkpoint must share with the run that resumes it, as :func:`job_digests` keys, and their names in messages."""

SWEEP_COMPARED = {"optim_settings": "optimizer settings (optim)"}
"""What a checkpoint must also share with a sweep job that resumes it under ``checkpoint.resume=auto``.

A single run may change its optimizer settings on resume; a job of a sweep that finds a
checkpoint saved with other settings found another job's (a trial of other values sharing its
``checkpoint.dir``), and would continue or finish as that job.
"""


def job_digests(plan: Plan) -> dict[str, str]:
    """Digests of what a checkpoint must share with the run that resumes it (the keys of :data:`COMPARED` and :data:`SWEEP_COMPARED`).

    The weights' shape (model, task), the data (without its ``reading_fields``, nor its
    ``location_fields`` when its content is digested), the
    optimizer kind (its state is restored as saved), the seed (it orders the samples) and,
    for data that reads files, their content (:meth:`DataBlock.content_digest`). A manifest
    written before a key existed does not hold it; a resume does not compare what it lacks.
    """
    content = plan.data.content_digest()
    compared = _compared(plan, _sections(plan), content is not None)
    if content is not None:
        compared["data_content"] = {"digest": content}
    return store.block_digests(compared)


SAMPLE_KEYS = ("data", "seed", "data_content")
"""The :func:`job_digests` keys that decide which samples a run trained on (the rest: the weights' shape, the optimizer)."""


def sample_digests(data: DataBlock, seed: int) -> dict[str, str]:
    """The :data:`SAMPLE_KEYS` digests of a run with *data* and ``trainer.seed`` *seed*, as :func:`job_digests` has them."""
    content = data.content_digest()
    section = {"_block_": data.block_name, **dataclasses.asdict(data)}
    compared: dict[str, dict[str, Any]] = {
        "data": _data_fields(data, section, content is not None),
        "seed": {"seed": seed},
    }
    if content is not None:
        compared["data_content"] = {"digest": content}
    return store.block_digests(compared)


def _data_fields(data: DataBlock, section: Mapping[str, Any], content_digested: bool) -> dict[str, Any]:
    """A data section without what a resume may change: *data*'s reading fields, and its location fields when its content is digested."""
    ignored = {*data.reading_fields, *(data.location_fields if content_digested else ())}
    return {k: v for k, v in section.items() if k not in ignored or section.get("_block_") != data.block_name}


def _sections(plan: Plan) -> dict[str, dict[str, Any]]:
    """The plan's block configs, as ``config.yaml`` records them (``_block_`` and every field)."""
    return {
        kind: {"_block_": block.block_name, **dataclasses.asdict(block)}
        for kind, block in (
            ("model", plan.model),
            ("task", plan.task),
            ("data", plan.data),
            ("optim", plan.optim),
        )
    } | {"trainer": {"seed": plan.trainer.seed}}


def _compared(plan: Plan, sections: Mapping[str, Any], content_digested: bool) -> dict[str, dict[str, Any]]:
    """The :data:`COMPARED` entries (but the data content) of block configs *sections*, as :func:`job_digests` digests them."""
    return {
        "model": dict(sections["model"]),
        "task": dict(sections["task"]),
        "data": _data_fields(plan.data, sections["data"], content_digested),
        "optim": {"_block_": sections["optim"].get("_block_")},
        "seed": {"seed": sections["trainer"].get("seed")},
        "optim_settings": dict(sections["optim"]),
    }


SEED_KEY = "trainer.seed"


def _differing_fields(
    plan: Plan, manifest: store.Manifest, differing: list[str], recorded: Mapping[str, Any] | None
) -> list[str]:
    """The config keys of *differing* entries that changed, as ``key saved -> now``; none unless *recorded* saved *manifest*.

    *recorded* is a run dir's ``config.yaml``: its entries are known to be the saving job's
    only where they give the digests the manifest holds.
    """
    if not recorded:
        return []
    try:
        before = _compared(plan, recorded, plan.data.content_digest() is not None)
    except (AttributeError, KeyError, TypeError):  # a config.yaml without a block's section
        return []
    after = _compared(plan, _sections(plan), plan.data.content_digest() is not None)
    digests = store.block_digests(before)
    fields = []
    for kind in differing:
        if kind not in before or digests[kind] != manifest.block_digests.get(kind):
            continue
        for name in sorted(before[kind].keys() | after[kind].keys(), key=lambda n: n != "_block_"):
            was, now = _plain(before[kind].get(name)), _plain(after[kind].get(name))
            if was != now:
                section = "optim" if kind == "optim_settings" else kind
                key = SEED_KEY if kind == "seed" else section if name == "_block_" else f"{section}.{name}"
                fields.append(f"{key} {was} -> {now}")
    return fields


def _plain(value: Any) -> str:
    """*value* as the digests serialize it (a tuple and a list of the same items are the same)."""
    return store.canonical_json(value)


def is_restart() -> bool:
    """Whether this process is an automatic restart (torchrun's restart count)."""
    return restart_count() > 0


START_FILE = ".resume-start.json"
"""In the run dir: the job's id, where its first attempt started, and what its checkpoint dir held then."""


@dataclasses.dataclass(frozen=True)
class Start:
    """Where a job's first attempt started, for its restarts and rollbacks (see :meth:`candidates`).

    Attributes:
        job: the job's id, written into every checkpoint it saves (:attr:`store.Manifest.job`).
        resumed_from: the checkpoint it resumed from (None: from scratch).
        lineage: URLs of the checkpoints in its directory it continues: the one it started from
            and those older there (none when it started from scratch or from elsewhere).
        foreign: URLs of the other entries its directory held when it started (another run's,
            committed or damaged).
    """

    job: str = ""
    resumed_from: str | None = None
    lineage: list[str] = dataclasses.field(default_factory=list)
    foreign: list[str] = dataclasses.field(default_factory=list)

    def candidates(self) -> store.Candidates | None:
        """What a restart or a rollback may load: the lineage and what this job saved (None: anything)."""
        return (
            store.Candidates(self.job, frozenset(self.lineage), frozenset(self.foreign)) if self.job else None
        )


def record_start(
    run_dir: Path, directory: str, resumed_from: str | None, config: str, nonce: str | None = None
) -> Start:
    """Write the job's :class:`Start` into *run_dir*; its first attempt resumes from *resumed_from*.

    The job's id is a digest of the run dir, its *config* text, its start and what the directory
    held, and of *nonce*: a random one by default (each ``blocks run`` is a job of its own);
    every node's driver of a multi-node job must pass the same one (their ids must agree).
    """
    listing = store.list_dir(directory)
    start = next((c for c in listing.committed if c.url == resumed_from), None)  # None: scratch, or elsewhere
    lineage = [
        c.url for c in listing.committed if start is not None and c.manifest.step <= start.manifest.step
    ]
    foreign = [c.url for c in listing.committed if c.url not in lineage] + [url for url, _ in listing.damaged]
    seen = [str(run_dir.resolve()), directory, resumed_from, lineage, sorted(foreign), config]
    seen.append(uuid.uuid4().hex if nonce is None else nonce)
    job = hashlib.sha256(json.dumps(seen).encode()).hexdigest()[:32]
    recorded = Start(job, resumed_from, lineage, foreign)
    (run_dir / START_FILE).write_text(json.dumps(dataclasses.asdict(recorded)))
    return recorded


def read_start(run_dir: Path | None) -> Start:
    """The :class:`Start` the job's first attempt recorded in *run_dir* (empty when there is none)."""
    try:
        return Start(**json.loads((run_dir / START_FILE).read_text())) if run_dir else Start()
    except (OSError, ValueError, TypeError):
        return Start()


def resolve_resume(
    plan: Plan,
    directory: str,
    start: Start | None = None,
    *,
    previous: Start | None = None,
    recorded: Mapping[str, Any] | None = None,
    in_sweep: bool = False,
) -> str | None:
    """The checkpoint this run resumes from, per ``checkpoint.resume``; refusals name the key and the fix.

    A worker passes *start*, the job's recorded start (:func:`read_start`): its ``auto`` and
    its automatic restarts load only what the job can call its own, those it saved and those
    it continues (:meth:`Start.candidates`). A restart does so whatever ``resume`` says:
    restarting from the configured URL (or from scratch with ``never``) would throw away the
    work since; without a start, a restart starts where the first attempt did.

    The driver of a new job passes *previous*, the start of the job its run dir held before
    (:func:`read_start` before :func:`record_start`): ``auto`` continues that job's lineage
    rather than a newer checkpoint it chose not to continue (see :func:`_newest_for_auto`).
    When the directory holds checkpoints but none can be used (all corrupt), the run fails
    with the reasons rather than silently training from step 0. A checkpoint past the run's
    last step (:attr:`Derived.total_steps`) is refused: nothing would be trained, and the
    run would end beyond the steps it was given. The driver passes *recorded*, its run dir's
    ``config.yaml``: a checkpoint of another model, task or data that it saved is refused
    naming the keys that changed. A job of a sweep (*in_sweep*) is also refused, under
    ``auto``, a checkpoint saved with other optimizer settings (:data:`SWEEP_COMPARED`) that
    its run dir's last job did not save or continue: another job's, found in a
    ``checkpoint.dir`` the jobs share (its run dir's own job, rerun, changes them as a single
    run does: :meth:`blocks.launch.sweep.SweepJob.claim` made sure it is the same job).

    A ``state.pt`` on an object store is downloaded once in this process: verifying it loads
    it from the bytes hashed, and the checks and the load that follow read that state
    (:func:`store.keeping`).
    """
    with store.keeping(_load_state_file):
        return _resolved(plan, directory, start, previous=previous, recorded=recorded, in_sweep=in_sweep)


def _load_state_file(source: str | BinaryIO, url: str) -> dict[str, Any]:
    """:func:`blocks.checkpoint.io.load_state_file`, imported (with torch) only once a state is read."""
    from blocks.checkpoint.io import load_state_file

    return load_state_file(source, url)


def _resolved(
    plan: Plan,
    directory: str,
    start: Start | None,
    *,
    previous: Start | None,
    recorded: Mapping[str, Any] | None,
    in_sweep: bool = False,
) -> str | None:
    """:func:`resolve_resume`'s answer."""
    block = plan.checkpoint
    if not block.enabled:
        return None
    restart = is_restart()
    if block.resume == "auto" or restart:
        if start is not None and start.job:
            found = _newest(directory, start.candidates())
            if found is None:
                _refuse_a_lost_position(directory, start)
        else:
            found = _newest_for_auto(directory, previous)
        if found is not None:
            same_settings = in_sweep and not _of_the_run_dirs_job(previous, found)
            return _usable(plan, found.url, found.manifest, recorded, same_settings=same_settings)
        if block.resume == "auto":
            return None
    if block.resume == "never":
        return None
    try:
        manifest = store.verify(block.resume)
    except Exception as exc:
        raise BlocksError(
            Problem(
                "checkpoint.resume",
                str(exc),
                "point checkpoint.resume at a committed checkpoint, or use auto",
            )
        ) from None
    return _usable(plan, block.resume, manifest, recorded)


def _of_the_run_dirs_job(previous: Start | None, found: store.Committed) -> bool:
    """Whether *found* was saved or continued by *previous*, the run dir's last job: a rerun of the job continues it."""
    candidates = previous.candidates() if previous is not None else None
    return candidates is not None and candidates.admit(found)


def _usable(
    plan: Plan,
    url: str,
    manifest: store.Manifest,
    recorded: Mapping[str, Any] | None,
    *,
    same_settings: bool = False,
) -> str:
    """*url*, once its checkpoint fits this run, lies within its steps and loads without unpickling anything.

    *same_settings*: it must also share the :data:`SWEEP_COMPARED` settings (a sweep job's ``auto``).
    """
    _check_compatible(plan, url, manifest, recorded, same_settings=same_settings)
    _check_within_steps(plan, url, manifest)
    _check_loadable(url, manifest)
    return url


def _check_within_steps(plan: Plan, url: str, manifest: store.Manifest) -> None:
    """Refuse a checkpoint saved past this run's last step: it would train nothing and end beyond it."""
    total = plan.derived.total_steps
    if total and manifest.step > total:
        raise BlocksError(
            Problem(
                "checkpoint.resume",
                f"{url} was saved at step {manifest.step}, past this run's last step {total} "
                "(trainer.max_steps, trainer.max_epochs): it would train nothing and end at step "
                f"{manifest.step}",
                f"raise trainer.max_steps (or trainer.max_epochs) to at least {manifest.step} to continue it, "
                "point checkpoint.resume at an earlier checkpoint, or start over with checkpoint.resume=never",
                related=("trainer.max_steps",),
            )
        )


def _newest_for_auto(directory: str, previous: Start | None) -> store.Committed | None:
    """What ``auto`` resumes from in *directory*, given the *previous* job of the run dir.

    The newest checkpoint, unless *previous* did not continue it while it saved checkpoints
    of its own: a job started with ``resume=never`` (or a URL) beside an older run's newer
    checkpoints, then interrupted, is continued from its own newest, not from the run it
    started over from. A newest checkpoint another job saved after *previous* started (a
    shared ``checkpoint.dir``) is ambiguous: refused, naming both.
    """
    found = _newest(directory)
    if found is None and previous is not None:
        _refuse_a_lost_position(directory, previous)
    if found is None or previous is None or not previous.job:
        return found
    candidates = previous.candidates()
    assert candidates is not None  # previous.job is set
    if candidates.admit(found):
        return found
    own = store.newest_valid(directory, candidates)
    if own is None:
        return found
    if found.url in candidates.foreign:
        log.warning(
            "checkpoint.resume=auto: continuing this run dir's last job from its step %d (%s), "
            "not step %d (%s) of the earlier run it started over from",
            own.manifest.step,
            own.url,
            found.manifest.step,
            found.url,
        )
        return own
    raise BlocksError(
        Problem(
            "checkpoint.resume",
            f"checkpoint.resume=auto is ambiguous: the newest checkpoint, step {found.manifest.step} "
            f"({found.url}), was saved by another job than this run dir's last one, whose newest is "
            f"step {own.manifest.step} ({own.url})",
            f"choose one: checkpoint.resume={own.url} continues this run dir's job, "
            f"checkpoint.resume={found.url} the other; or start over with checkpoint.resume=never",
        )
    )


def refuse_foreign_in_the_way(plan: Plan, directory: str, resume_from: str | None) -> None:
    """Refuse, before training, a ``step-<N>`` entry blocks did not write at a step this run may save at.

    That is any step past the one it starts from up to its last (:attr:`Derived.total_steps`):
    besides every ``checkpoint.every_n_steps`` and the last step, a SIGTERM (preemption) or
    ``checkpoint.every_seconds`` saves at whatever step the run has reached. Blocks never deletes
    an entry it did not write, so the save there would fail, losing the steps trained since the
    previous one (on a preemption, all of them). Entries at other steps are left alone.
    """
    start = store.read_manifest(resume_from).step if resume_from else 0
    total = plan.derived.total_steps
    for url in store.list_dir(directory).foreign:
        step = store.named_step(url)
        if step is None or not url.rstrip("/").endswith(f"/{store.step_dir_name(step)}"):
            continue  # not where blocks saves a step
        if step <= start or (total and step > total):
            continue
        raise BlocksError(
            Problem(
                "checkpoint.dir",
                f"{url} was not written by blocks, and this run may save its checkpoint of step {step} "
                "there (at checkpoint.every_n_steps, its last step, or whatever step a SIGTERM or "
                "checkpoint.every_seconds saves at): the save would fail after training up to it",
                "move it out of checkpoint.dir, or set another checkpoint.dir",
                check="checkpoint-dir-foreign",
            )
        )


def _refuse_a_lost_position(directory: str, previous: Start) -> None:
    """Refuse step 0 when the job *previous* started, which resumed from a checkpoint in *directory*, finds none of its own there now.

    *previous* is the run dir's last job (a new job's ``auto``) or this job itself (a worker:
    its restarts, whatever ``resume`` says, and its ``auto``). Its checkpoints were deleted or
    lost (a save that replaced the one it resumed from, cut short by a kill, did so before):
    starting over silently would throw its steps away.
    """
    resumed = previous.resumed_from
    if not resumed or resumed not in previous.lineage:
        return  # it started from scratch, or from a checkpoint elsewhere
    if not store.same_place(resumed.rstrip("/").rsplit("/", 1)[0], directory):
        return
    raise BlocksError(
        Problem(
            "checkpoint.resume",
            f"none of the checkpoints this run dir's job saved or continued is left in {directory} "
            f"(it resumed from {resumed} there): they were deleted or lost, and training would start "
            "over from step 0",
            f"restore the checkpoints into {directory} (or rerun pointing checkpoint.resume at a copy "
            "of one), or rerun from step 0 with checkpoint.resume=never",
            check="resume-usable",
        )
    )


def _check_loadable(url: str, manifest: store.Manifest) -> None:
    """Refuse, before any process starts, a checkpoint whose loading would unpickle anything but data or read unverified shards."""
    from blocks.checkpoint.io import UnsafeCheckpointError, load_state

    try:
        if manifest.sharded:
            from blocks.checkpoint.safe_dcp import check_sharded

            check_sharded(url, manifest)
        _stopped_early[url] = _stopped_early_in(load_state(url, mmap=True))
    except UnsafeCheckpointError as exc:
        raise BlocksError(
            Problem(
                "checkpoint.resume",
                str(exc),
                "resume only from checkpoints blocks wrote (tensors and plain data); never from an untrusted one",
                check="checkpoint-unsafe",
            )
        ) from None
    except store.CheckpointError as exc:
        raise BlocksError(
            Problem(
                "checkpoint.resume",
                str(exc),
                "resume from another committed checkpoint (checkpoint.resume=<its step directory>), "
                "or start over with checkpoint.resume=never",
            )
        ) from None


def _newest(directory: str, candidates: store.Candidates | None = None) -> store.Committed | None:
    try:
        found, skipped = store.find_valid(directory, candidates)
    except Exception as exc:
        raise BlocksError(
            Problem(
                "checkpoint.dir",
                f"cannot read {directory}: {exc}",
                "check the URL, credentials and file system",
            )
        ) from None
    if found is None and skipped:
        raise BlocksError(
            Problem(
                "checkpoint.resume",
                f"{directory} holds checkpoints to resume from, but none is usable: " + "; ".join(skipped),
                "restore or remove the damaged checkpoints, or train from scratch with checkpoint.resume=never",
                check="resume-usable",
            )
        )
    return found


_stopped_early: dict[str, int | None] = {}
"""What :func:`_check_loadable` read of each checkpoint's ``stopped_early_of``: the state is read once per resume
(from an object store, the state :func:`resolve_resume` kept)."""


def stopped_early_of(url: str) -> int | None:
    """The steps the run that saved checkpoint *url* was given when a callback stopped it before them (None: not stopped early).

    Its checkpoint callback records them in the state (``stopped_early_of``): rerun with no
    more steps, the run trains nothing.
    """
    from blocks.checkpoint.io import load_state

    if url in _stopped_early:  # taken once: a later run may write a new checkpoint at the same url
        return _stopped_early.pop(url)
    try:
        return _stopped_early_in(load_state(url, mmap=True))
    except Exception:  # resolving the resume already refused a checkpoint that does not load
        return None


def _stopped_early_in(state: dict[str, Any]) -> int | None:
    """The ``stopped_early_of`` a checkpoint's *state* records in its checkpoint callback's state."""
    callbacks = state.get("callbacks") or {}
    for saved in callbacks.values() if isinstance(callbacks, dict) else ():
        if isinstance(saved, dict) and isinstance(saved.get("stopped_early_of"), int):
            return int(saved["stopped_early_of"])
    return None


def resume_message(url: str) -> str:
    """What a run prints when it resumes: ``resuming from step N of <url>``."""
    return f"resuming from step {store.read_manifest(url).step} of {url}"


LEGACY_DATA_IGNORED = ("batch_size", "num_workers")
"""What the data digest left out before reading and location fields: a frozen format, not a block's attribute."""


def _data_digest_of_every_field(plan: Plan) -> str:
    """The data digest as checkpoints saved before reading and location fields wrote it (every field but batch size and workers)."""
    fields = {k: v for k, v in dataclasses.asdict(plan.data).items() if k not in LEGACY_DATA_IGNORED}
    return store.block_digests({"data": {"_block_": plan.data.block_name, **fields}})["data"]


def _check_compatible(
    plan: Plan,
    url: str,
    manifest: store.Manifest,
    recorded: Mapping[str, Any] | None = None,
    *,
    same_settings: bool = False,
) -> None:
    digests = job_digests(plan)
    accepted = {kind: {digest} for kind, digest in digests.items()}
    accepted["data"].add(_data_digest_of_every_field(plan))
    differing = [kind for kind in digests if manifest.block_digests.get(kind) not in (None, *accepted[kind])]
    settings = [kind for kind in differing if kind in SWEEP_COMPARED]
    differing = [kind for kind in differing if kind not in SWEEP_COMPARED]
    problems = []
    if settings and same_settings and not differing:
        fields = _differing_fields(plan, manifest, settings, recorded)
        problems.append(
            Problem(
                "checkpoint.dir",
                f"{url}, the newest checkpoint in this sweep job's checkpoint.dir, was saved by a job with "
                f"different {', '.join(SWEEP_COMPARED[k] for k in settings)}"
                + (f": {', '.join(fields)}" if fields else "")
                + ": another job's, which this one would continue (or finish as) under checkpoint.resume=auto",
                "give each job of the sweep a checkpoint.dir of its own that names every key its sweep varies "
                "(and a prefix per sweep, e.g. checkpoint.dir=<dir>/<sweep>/lr${optim.lr}), or leave "
                "checkpoint.dir unset (each job then keeps its checkpoints in its own run dir); "
                f"checkpoint.resume={url} continues it anyway, checkpoint.resume=never starts fresh",
                related=("checkpoint.resume",),
            )
        )
    if differing:
        fields = _differing_fields(plan, manifest, differing, recorded)
        problems.append(
            Problem(
                "checkpoint.resume",
                f"{url} was saved by a job with a different {', '.join(COMPARED.get(k, k) for k in differing)}"
                + (f": {', '.join(fields)}" if fields else ""),
                "resume with the same blocks, seed and data, or start fresh with checkpoint.resume=never "
                "(or another checkpoint.dir)",
            )
        )
    if manifest.global_batch and manifest.global_batch != plan.derived.global_batch:
        problems.append(
            Problem(
                "checkpoint.resume",
                f"{url} was trained with a global batch of {manifest.global_batch}, this run's is "
                f"{plan.derived.global_batch}",
                "keep data.batch_size × world size × optim.accumulate equal to the checkpoint's to continue "
                "the same batch stream",
            )
        )
    if manifest.sharded != plan.strategy.memory_layout().shards_parameters:
        saved, now = ("sharded (FSDP)", "full") if manifest.sharded else ("full", "sharded (FSDP)")
        problems.append(
            Problem(
                "checkpoint.resume",
                f"{url} is a {saved} checkpoint, but strategy={plan.strategy.block_name} loads {now} ones",
                "resume with the strategy that saved it, or export its weights "
                "(blocks.checkpoint.export) and start a new run from them",
                related=("strategy",),
            )
        )
    if problems:
        raise BlocksError(problems)
