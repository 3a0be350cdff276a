"""The one table of ``TrainingArguments`` fields that differ on purpose from transformers 5.24's, with the reason.

``tests/args/test_upstream_fields.py`` reads upstream's ``dataclasses.fields`` of ``TrainingArguments`` and
``Seq2SeqTrainingArguments`` at test time: every upstream field must exist here with the same declared default, a
compatible annotation and the same value after ``__post_init__``, or be listed below for that aspect (``"default"``,
``"type"``, ``"value"``). The README's section "Arguments that differ from transformers" is :func:`markdown_table`'s
output (a test keeps them equal).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["FieldDifference", "FIELD_DIFFERENCES", "markdown_table"]


class FieldDifference(NamedTuple):
    """How one field differs: which aspects, upstream's and trainwell's value or type, and why."""

    aspects: frozenset[str]  # of "default" (declared), "type" (annotation), "value" (after __post_init__)
    upstream: str
    trainwell: str
    why: str


def _d(aspects: str, upstream: str, trainwell: str, why: str) -> FieldDifference:
    return FieldDifference(frozenset(aspects.split()), upstream, trainwell, why)


FIELD_DIFFERENCES: dict[str, FieldDifference] = {
    "output_dir": _d("default", "`None`, `\"trainer_output\"` after init", "`\"trainer_output\"`",
                     "the same value after init; the declared default says it"),
    "lr_scheduler_kwargs": _d("default value", "`None`", "`{}`", "the same meaning, a dict the code reads directly"),
    "fsdp": _d("default value", "`None`", "`\"\"`, `[]` after init", "the same meaning, an empty option list"),
    "fsdp_config": _d("value", "`None` after init", "a dict of the options trainwell reads, with their defaults",
                      "one place for the FSDP options"),
    "accelerator_config": _d("value", "an `AcceleratorConfig` after init", "`None`",
                             "trainwell does not run on accelerate; the values its loaders have are checked"),
    "run_name": _d("value", "`None` after init", "`output_dir`", "older releases' default, read by the trackers"),
    "generation_config": _d("type", "`str | Path | GenerationConfig | None`", "`dict | str | None`",
                            "trainwell does not import transformers' `GenerationConfig`; a `GenerationConfig`, a "
                            "`Path` and a dict are accepted all the same"),
}


def markdown_table() -> str:
    """The table as the README shows it (one row per field, sorted by name)."""
    rows = ["| Field | Differs in | transformers 5.24 | trainwell | Why |", "|---|---|---|---|---|"]
    for name in sorted(FIELD_DIFFERENCES):
        diff = FIELD_DIFFERENCES[name]
        aspects = ", ".join(sorted(diff.aspects))
        rows.append(f"| `{name}` | {aspects} | {diff.upstream} | {diff.trainwell} | {diff.why} |")
    return "\n".join(rows) + "\n"
