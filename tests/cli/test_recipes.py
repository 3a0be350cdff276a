"""Recipes: the built-in char-level LM factories and YAML recipe loading."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trainwell.cli.recipes import RecipeError, call_factory, default_recipe, load_object, load_recipe
from trainwell.cli.recipes import charlm
from helpers.launch import ROOT

EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def small_data():
    return charlm.build_datasets(block_size=16, max_chars=20_000, max_eval_samples=32)


def test_stdlib_text_is_deterministic_and_ascii():
    a = charlm.stdlib_docstring_text(max_chars=5000)
    b = charlm.stdlib_docstring_text(max_chars=5000)
    assert a == b and len(a) == 5000
    assert all(c == "\n" or 32 <= ord(c) < 127 for c in a)


def test_build_datasets_deterministic_split_and_shifted_labels(small_data):
    train, evaluation, vocab = small_data
    train2, evaluation2, vocab2 = charlm.build_datasets(block_size=16, max_chars=20_000, max_eval_samples=32)
    assert vocab == vocab2 and len(train) == len(train2) and len(evaluation) == len(evaluation2) == 32
    item = train[3]
    assert set(item) == {"input_ids", "labels"} and item["input_ids"].dtype == torch.long
    assert item["input_ids"].shape == item["labels"].shape == (16,)
    assert torch.equal(item["input_ids"][1:], item["labels"][:-1])  # labels are the next characters
    assert torch.equal(train[3]["labels"], train2[3]["labels"])
    assert not set(train.starts) & set(evaluation.starts)  # train and eval chunks never share text
    assert vocab.decode(vocab.encode("Return the")) == "Return the"


def test_vocab_roundtrip(tmp_path, small_data):
    vocab = small_data[2]
    vocab.save_pretrained(tmp_path)
    assert charlm.CharVocab.from_pretrained(tmp_path) == vocab
    assert vocab.encode("\u00e9") == vocab.encode("?")  # unknown characters map to "?"


def test_model_loss_mean_and_num_items(small_data):
    train, _, vocab = small_data
    torch.manual_seed(0)
    model = charlm.build_model(vocab.size, d_model=32, n_heads=2, block_size=16)
    batch = {k: torch.stack([train[i][k] for i in range(4)]) for k in ("input_ids", "labels")}
    batch["labels"][0, :5] = -100
    out = model(**batch)
    assert out["logits"].shape == (4, 16, vocab.size)
    assert abs(out["loss"].item() - torch.log(torch.tensor(float(vocab.size))).item()) < 0.3  # ~uniform at init
    n_items = int((batch["labels"] != -100).sum())
    summed = model(**batch, num_items_in_batch=2 * n_items)["loss"]
    torch.testing.assert_close(summed * 2, out["loss"])  # sum / N: half the mean when N is doubled
    assert "loss" not in model(batch["input_ids"])


def test_model_is_causal(small_data):
    vocab = small_data[2]
    torch.manual_seed(0)
    model = charlm.build_model(vocab.size, d_model=32, n_heads=2, block_size=16).eval()
    ids = torch.randint(0, vocab.size, (1, 16))
    changed = ids.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % vocab.size
    torch.testing.assert_close(model(ids)["logits"][0, :10], model(changed)["logits"][0, :10])


def test_generate_is_deterministic(small_data):
    vocab = small_data[2]
    torch.manual_seed(0)
    model = charlm.build_model(vocab.size, d_model=32, n_heads=2, block_size=16)
    a = charlm.generate(model, vocab, "Return", n=20, seed=1)
    assert a == charlm.generate(model, vocab, "Return", n=20, seed=1) and len(a) == 20
    assert model.training  # the sampler restores the mode


def test_default_recipe_builds():
    recipe = default_recipe()
    assert recipe.args["output_dir"] == "trainwell-output" and recipe.args["eval_strategy"] == "steps"
    torch.manual_seed(0)
    parts = recipe.build()
    assert len(parts.train_dataset) > 10 * len(parts.eval_dataset) > 0
    assert parts.extras["vocab"].size == parts.model.config["vocab_size"]


def test_load_object_errors():
    assert load_object("textwrap:dedent") is textwrap.dedent
    assert load_object("os.path:join") is __import__("os").path.join
    with pytest.raises(RecipeError, match=r"r.yaml, key 'model'.*cannot import module 'no_such_mod_xyz'"):
        load_object("no_such_mod_xyz:f", key="model", source="r.yaml")
    with pytest.raises(RecipeError, match="module 'textwrap' has no attribute 'nope'"):
        load_object("textwrap:nope", key="model")
    with pytest.raises(RecipeError, match="write it as 'package.module:function'"):
        load_object("textwrap.dedent", key="model")
    with pytest.raises(RecipeError, match="'string:digits' is not callable"):
        call_factory({"factory": "string:digits"}, key="model")
    with pytest.raises(RecipeError, match=r"kwargs \{'bogus': 1\} do not fit textwrap:dedent"):
        call_factory({"factory": "textwrap:dedent", "kwargs": {"bogus": 1}}, key="train_dataset")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_yaml_recipe_builds_components(tmp_path, monkeypatch):
    module = tmp_path / "tiny_recipe_mod.py"
    module.write_text(textwrap.dedent("""
        import torch
        def model(width=3):
            return torch.nn.Linear(width, 2)
        def data(n=4):
            return [{"x": torch.zeros(3)}] * n, [{"x": torch.ones(3)}]
        def collate(items):
            return items
    """))
    monkeypatch.setattr(sys, "path", list(sys.path))
    path = _write(tmp_path, """
        model: {factory: tiny_recipe_mod:model, kwargs: {width: 3}}
        datasets: {factory: tiny_recipe_mod:data, kwargs: {n: 5}}
        data_collator: tiny_recipe_mod:collate
        args: {max_steps: 7, learning_rate: 0.1}
    """)
    recipe = load_recipe(path)
    assert recipe.args == {"max_steps": 7, "learning_rate": 0.1}
    parts = recipe.build()
    assert parts.model.in_features == 3 and len(parts.train_dataset) == 5 and len(parts.eval_dataset) == 1
    assert parts.data_collator([1]) == [1]
    assert set(parts.trainer_kwargs()) == {"model", "train_dataset", "eval_dataset", "data_collator"}
    sys.modules.pop("tiny_recipe_mod", None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model: {factory: a:b}\nbogus: 1\n", r"unknown keys \['bogus'\]"),
        ("args: {}\n", "missing key 'model'"),
        ("model: [1, 2\n", "invalid YAML"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("model: {factory: a:b}\ndatasets: {factory: a:b}\ntrain_dataset: {factory: a:b}\n", "not both"),
    ],
)
def test_yaml_recipe_errors(tmp_path, text, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(_write(tmp_path, text))


def test_missing_recipe_file(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "nope.yaml")


def test_example_recipe_builds(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    recipe = load_recipe(EXAMPLES / "recipe.yaml")
    parts = recipe.build()
    item = parts.train_dataset[0]
    out = parts.model(item["pixels"][None], labels=item["labels"][None])
    assert out["loss"].ndim == 0 and out["logits"].shape == (1, 10)
    assert len(parts.train_dataset) + len(parts.eval_dataset) == 1797
    sys.modules.pop("my_recipe", None)


def test_the_example_recipe_writes_beside_the_built_in_run_not_inside_it(monkeypatch):
    """`trainwell train` then `trainwell train examples/recipe.yaml`, as the README runs them: a run of the example
    inside the built-in run's folder would be refused (or mixed with it) as a folder in use."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    example = Path(load_recipe(ROOT / "examples" / "recipe.yaml").args["output_dir"]).resolve()
    built_in = Path(default_recipe().args["output_dir"]).resolve()
    assert example != built_in and built_in not in example.parents and example not in built_in.parents
