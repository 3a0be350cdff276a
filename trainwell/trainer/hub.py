"""Pushing to the Hugging Face Hub with ``huggingface_hub`` (the real client, imported lazily).

As upstream: ``push_to_hub=True`` creates the repository ``hub_model_id`` (default: the name of ``output_dir``) when
the Trainer is built; each checkpoint save pushes the model files of ``output_dir`` in the background
(``hub_strategy``: ``every_save``; ``checkpoint`` also pushes the checkpoint as ``last-checkpoint/``;
``all_checkpoints`` pushes every checkpoint under its own name; ``end`` pushes nothing while training). A save that
comes while the previous push is still running is skipped unless ``hub_always_push``. ``Trainer.push_to_hub()``
saves the model, writes the model card (``README.md``) and uploads ``output_dir`` (without checkpoints); training
waits for a running push at its end. Only the main process talks to the hub. ``HF_ENDPOINT`` picks the server.

:class:`TrainerHub` is a part of :class:`trainwell.trainer.trainer.Trainer` (``trainer._tw_hub``, built at the first
use); the Trainer's upstream methods (``init_hf_repo``, ``create_model_card``, ``push_to_hub``,
``_push_from_checkpoint``, ``_finish_current_push``) delegate to it, and where upstream calls an overridable method
(``save_model``, ``create_model_card``, ``init_hf_repo``) it calls the Trainer's, so that an override is reached.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..utils.secrets import without_secrets
from ..utils.checkpoint_names import PREFIX_CHECKPOINT_DIR
from ..utils.option_enums import HubStrategy, SaveStrategy
from .checkpointing.output_dir_runs import require_output_dir

if TYPE_CHECKING:
    from ..args.fields import TrainingArguments
    from ..callbacks.events import CallbackHandler
    from ..utils.trainer_state import TrainerControl, TrainerState

logger = logging.getLogger("trainwell.trainer.trainer")

_MODEL_FILES = ("config.json", "generation_config.json", "pytorch_model.bin", "model.safetensors")
_INDEX_FILES = ("pytorch_model.bin.index.json", "model.safetensors.index.json")
_TMP = ".tmp-push-"
# Never uploaded from output_dir: checkpoints (pushed by hub_strategy), trainwell's temporary folders and files
# (checkpoints being written, .tmp-push- copies) and its output_dir lock.
_IGNORE = ["_*", f"{PREFIX_CHECKPOINT_DIR}-*", ".tmp-*", ".*.tmp-*", ".trainwell.lock"]
_CARD_HPARAMS = (("learning_rate", "learning_rate"), ("train_batch_size", "per_device_train_batch_size"),
                 ("eval_batch_size", "per_device_eval_batch_size"), ("seed", "seed"),
                 ("gradient_accumulation_steps", "gradient_accumulation_steps"),
                 ("optimizer", "optim"), ("lr_scheduler_type", "lr_scheduler_type"),
                 ("warmup_steps", "warmup_steps"), ("num_epochs", "num_train_epochs"),
                 ("training_steps", "max_steps"))


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError as exc:
        raise ImportError("push_to_hub needs huggingface_hub: pip install huggingface_hub") from exc
    return huggingface_hub


def _hf_api() -> Any:
    # HF_ENDPOINT read now, not when huggingface_hub was imported: a server chosen after import is honoured
    return _hub().HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)


class PushInProgress:
    """The background uploads of one or more checkpoint saves (``concurrent.futures`` futures)."""

    def __init__(self, jobs: list[Any]) -> None:
        self.jobs = jobs

    def is_done(self) -> bool:
        """Whether every upload has finished (successfully or not)."""
        return all(job.done() for job in self.jobs)

    def wait_until_done(self) -> None:
        """Block until every upload has finished; an upload's error is raised here."""
        for job in self.jobs:
            job.result()


class HubHost(Protocol):
    """What the hub part reads from the Trainer and the overridable Trainer methods it calls back."""

    args: TrainingArguments
    state: TrainerState
    control: TrainerControl
    model: Any
    processing_class: Any
    callback_handler: CallbackHandler

    def is_world_process_zero(self) -> bool: ...

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None: ...

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None: ...

    def create_model_card(self, language: str | None = None, license: str | None = None,
                          tags: str | list[str] | None = None, model_name: str | None = None,
                          finetuned_from: str | None = None, tasks: str | list[str] | None = None,
                          dataset_tags: str | list[str] | None = None, dataset: str | list[str] | None = None,
                          dataset_args: str | list[str] | None = None) -> None: ...


class TrainerHub:
    """The hub side of one Trainer: its repository, the model card, the end push and the checkpoint pushes."""

    def __init__(self, trainer: HubHost) -> None:
        self._trainer = trainer  # its arguments are read at each call: a hyper-parameter trial replaces them
        self.model_id: str | None = None  # the repository created by init_repo (upstream's trainer.hub_model_id)
        self.push_in_progress: PushInProgress | None = None  # the checkpoint pushes running in the background

    def init_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create (or reuse) the hub repository ``args.hub_model_id`` (default: ``output_dir``'s name)."""
        trainer = self._trainer
        if not trainer.is_world_process_zero():
            return
        args = trainer.args
        name = args.hub_model_id or Path(require_output_dir(args.output_dir)).absolute().name
        token = token if token is not None else args.hub_token
        private = private if private is not None else args.hub_private_repo
        self.model_id = _hf_api().create_repo(name, token=token, private=private, exist_ok=True).repo_id
        self.push_in_progress = None

    def create_model_card(self, language: str | None = None, license: str | None = None,
                          tags: str | list[str] | None = None, model_name: str | None = None,
                          finetuned_from: str | None = None, tasks: str | list[str] | None = None,
                          dataset_tags: str | list[str] | None = None, dataset: str | list[str] | None = None,
                          dataset_args: str | list[str] | None = None) -> None:
        """Write ``output_dir/README.md``: metadata, the training hyper-parameters and the evaluation results."""
        if not self._trainer.is_world_process_zero():
            return
        ModelCard, ModelCardData = _hub().ModelCard, _hub().ModelCardData

        output_dir = require_output_dir(self._trainer.args.output_dir)
        path = os.path.join(output_dir, "README.md")
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        if os.path.exists(path):  # keep the tags a previous card had
            tags += [t for t in (ModelCard.load(path).data.tags or []) if t not in tags]
        tags += [t for t in ("trainwell", "generated_from_trainer") if t not in tags]
        name = model_name or Path(output_dir).name

        def as_list(value: Any) -> Any:
            return [value] if isinstance(value, str) else value

        data = ModelCardData(language=language, license=license, tags=tags, base_model=finetuned_from,
                             datasets=as_list(dataset), library_name="trainwell", model_name=name,
                             pipeline_tag=as_list(tasks)[0] if tasks else None)
        os.makedirs(output_dir, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"---\n{data.to_yaml()}\n---\n\n{_model_card_body(self._trainer, name, finetuned_from)}")

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None,
                    **kwargs: Any) -> Any:
        """Save the model and upload ``output_dir`` (no checkpoints) with a model card to the repository.

        Returns the ``CommitInfo`` (a future of it with ``blocking=False``); None on the other processes.
        ``kwargs`` go to the Trainer's ``create_model_card``.
        """
        trainer = self._trainer
        args = trainer.args
        trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
        model_name = kwargs.pop("model_name", None)
        if model_name is None and args.should_save:
            model_name = (args.hub_model_id or Path(require_output_dir(args.output_dir)).name).split("/")[-1]
        token = token if token is not None else args.hub_token
        if self.model_id is None:
            trainer.init_hf_repo(token=token, private=private)
        trainer.save_model(_internal_call=True)
        if not trainer.is_world_process_zero():
            return None
        model_tags = getattr(trainer.model, "model_tags", None)
        if model_tags:
            tags = kwargs.get("tags") or []
            tags = [tags] if isinstance(tags, str) else list(tags)
            kwargs["tags"] = tags + [t for t in model_tags if t not in tags]
        trainer.create_model_card(model_name=model_name, **kwargs)
        self.finish_current_push()
        return _hf_api().upload_folder(repo_id=self.model_id, folder_path=args.output_dir,
                                       commit_message=commit_message, token=token, run_as_future=not blocking,
                                       ignore_patterns=_IGNORE,
                                       revision=revision if revision is not None else args.hub_revision)

    def push_from_checkpoint(self, checkpoint_folder: str | os.PathLike) -> None:
        """After a checkpoint save: copy its model files to ``output_dir`` and push in the background."""
        trainer = self._trainer
        args = trainer.args
        if not args.push_to_hub or not trainer.is_world_process_zero() or args.hub_strategy == HubStrategy.END:
            return
        if not args.hub_always_push and self.push_in_progress is not None and not self.push_in_progress.is_done():
            return  # the previous push is still running: skip this one (hub_always_push queues it)
        trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
        folder, output_dir = Path(checkpoint_folder), require_output_dir(args.output_dir)
        _copy_model_files(folder, output_dir, trainer.processing_class, args)
        message = (f"Training in progress, step {trainer.state.global_step}" if args.save_strategy ==
                   SaveStrategy.STEPS else f"Training in progress, epoch {int(trainer.state.epoch or 0)}")
        api = _hf_api()
        jobs = [api.upload_folder(repo_id=self.model_id, folder_path=output_dir, commit_message=message,
                                  token=args.hub_token, run_as_future=True, revision=args.hub_revision,
                                  ignore_patterns=_IGNORE)]
        if args.hub_strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS):
            in_repo = "last-checkpoint" if args.hub_strategy == HubStrategy.CHECKPOINT else folder.name
            jobs.append(api.upload_folder(repo_id=self.model_id, folder_path=str(folder), path_in_repo=in_repo,
                                          commit_message=message + ", checkpoint", token=args.hub_token,
                                          run_as_future=True, revision=args.hub_revision))
        if self.push_in_progress is None or self.push_in_progress.is_done():
            self.push_in_progress = PushInProgress(jobs)
        else:
            self.push_in_progress.jobs.extend(jobs)

    def finish_current_push(self) -> None:
        """Wait for a running background push (end of training, before a final push)."""
        if self.push_in_progress is not None and not self.push_in_progress.is_done():
            logger.info("Waiting for the current checkpoint push to be finished, this might take a couple of minutes.")
            self.push_in_progress.wait_until_done()


def _copy_model_files(folder: Path, output_dir: str, processing_class: Any, args: Any) -> None:
    """A checkpoint's model files, the processing class and the arguments, copied into ``output_dir`` for a push."""
    files = list(_MODEL_FILES)
    for index in _INDEX_FILES:
        if (folder / index).is_file():
            files.append(index)
            files += sorted(set(json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"].values()))
    for name in files:  # replaced whole: a push still running (hub_always_push) never reads a half copy
        if (folder / name).is_file():
            tmp = os.path.join(output_dir, f"{_TMP}{name}")
            shutil.copy(folder / name, tmp)
            os.replace(tmp, os.path.join(output_dir, name))
    if processing_class is not None and hasattr(processing_class, "save_pretrained"):
        processing_class.save_pretrained(output_dir)
    torch.save(without_secrets(args), os.path.join(output_dir, f"{_TMP}training_args.bin"))
    os.replace(os.path.join(output_dir, f"{_TMP}training_args.bin"), os.path.join(output_dir, "training_args.bin"))


def _model_card_body(trainer: HubHost, name: str, finetuned_from: str | None) -> str:
    """The card's text: what the model is, its evaluation results and the training hyper-parameters."""
    args, state = trainer.args, trainer.state
    lines = [f"# {name}", ""]
    lines.append(f"This model is a fine-tuned version of {finetuned_from}." if finetuned_from
                 else "This model was trained with trainwell.")
    evals = [e for e in state.log_history if any(k.startswith("eval_") for k in e)]
    if evals:
        lines += ["It achieves the following results on the evaluation set:"]
        lines += [f"- {k[5:].replace('_', ' ').title()}: {v:.4f}" for k, v in evals[-1].items()
                  if k.startswith("eval_") and isinstance(v, (int, float)) and not k.endswith(("_runtime",
                  "_per_second"))]
    lines += ["", "## Training hyperparameters", "", "The following hyperparameters were used during training:"]
    for label, attr in _CARD_HPARAMS:
        value = getattr(args, attr, None)
        if attr in ("max_steps", "warmup_steps") and not value:
            continue
        lines.append(f"- {label}: {getattr(value, 'value', value)}")
    if evals:
        keys = [k for k in evals[-1] if k.startswith("eval_") and not k.endswith(("_runtime", "_per_second"))]
        train_losses = {e["step"]: e["loss"] for e in state.log_history if "loss" in e}
        lines += ["", "## Training results", "",
                  "| Training Loss | Epoch | Step | " + " | ".join(k[5:] for k in keys) + " |",
                  "|" + "---|" * (3 + len(keys))]
        for e in evals:
            loss = train_losses.get(e.get("step"))
            cells = ["No log" if loss is None else f"{loss:.4f}", f"{e.get('epoch', 0):.1f}", str(e.get("step"))]
            cells += [f"{e[k]:.4f}" if isinstance(e.get(k), (int, float)) else "" for k in keys]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
