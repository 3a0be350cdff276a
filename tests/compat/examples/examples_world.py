"""The offline world the example scripts run in: a word-level tokenizer, seven tiny models (every dropout 0) and each
task's train/validation/test files, all made from the standard library's docstrings.

Everything is deterministic and independent of the installed ``transformers`` release, so the v4 golden recorder
(run in a venv with transformers 4.47) and the tests (run with the installed 5.x) see the same tokens and the same
initial weights: the weights are drawn by this module's own generator, parameter by parameter in name order, not by
the library's initialisers. :func:`weights_fingerprint` lets the tests check that both eras started from one model.

Run as ``python examples_world.py FOLDER`` to build it into FOLDER.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB_WORDS = 300  # the most frequent words of the corpus; the rest map to [UNK]
_MODULES = ("json", "textwrap", "string", "pathlib", "functools", "collections", "itertools", "shutil", "random",
            "difflib", "fractions", "statistics", "heapq", "bisect", "copy", "argparse")
WORD = re.compile(r"[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]")


def sentences() -> list[str]:
    """Sentences of 5 to 24 words from the docstrings of a fixed list of standard modules, in a fixed order."""
    found: list[str] = []
    for name in _MODULES:
        module = __import__(name)
        docs = [inspect.getdoc(module) or ""]
        for attr in sorted(vars(module)):
            if not attr.startswith("_"):
                docs.append(inspect.getdoc(getattr(module, attr)) or "")
        for doc in docs:
            for part in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
                words = part.split()
                if 5 <= len(words) <= 24 and part not in found:
                    found.append(part)
    return found


def build_vocab(texts: list[str]) -> dict[str, int]:
    """The special tokens, then the :data:`VOCAB_WORDS` most frequent lowercased words (ties by spelling)."""
    counts: dict[str, int] = {}
    for text in texts:
        for word in WORD.findall(text.lower()):
            counts[word] = counts.get(word, 0) + 1
    ranked = sorted(counts, key=lambda w: (-counts[w], w))[:VOCAB_WORDS]
    return {token: i for i, token in enumerate(SPECIALS + ranked)}


def build_tokenizer(vocab: dict[str, int], folder: Path) -> None:
    """A BERT-shaped fast tokenizer (lowercase, ``[CLS] a [SEP] b [SEP]``, token type ids in every release) saved
    into ``folder``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    # The input names are spelled out: 4.x's tokenizer returns token_type_ids by default, 5.x's none, and the
    # segment ids change a pair's BERT embeddings (qa, swag) and GPT-2's (it embeds them with its token table).
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=64,
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    fast.save_pretrained(str(folder))


def _bert(vocab_size: int, **extra: Any):
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=64, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, classifier_dropout=0.0, pad_token_id=0, **extra)


def model_specs(vocab_size: int) -> dict[str, tuple[str, Any]]:
    """Task name -> (model class name, config)."""
    from transformers import GPT2Config, T5Config

    gpt2 = GPT2Config(vocab_size=vocab_size, n_positions=64, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0, bos_token_id=2, eos_token_id=3)
    t5 = T5Config(vocab_size=vocab_size, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2,
                  dropout_rate=0.0, pad_token_id=0, eos_token_id=3, decoder_start_token_id=0)
    return {
        "glue": ("BertForSequenceClassification", _bert(vocab_size, num_labels=2)),
        "ner": ("BertForTokenClassification", _bert(vocab_size, num_labels=3)),
        "qa": ("BertForQuestionAnswering", _bert(vocab_size)),
        "swag": ("BertForMultipleChoice", _bert(vocab_size)),
        "mlm": ("BertForMaskedLM", _bert(vocab_size)),
        "clm": ("GPT2LMHeadModel", gpt2),
        "summarization": ("T5ForConditionalGeneration", t5),
    }


def init_weights(model: Any, seed: int) -> None:
    """Every parameter and buffer of floating type drawn from one generator in name order (norm weights 1, biases
    0), so the initial model is the same whatever release of transformers built it."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if name.endswith("bias"):
                param.zero_()
            elif "LayerNorm" in name or "layer_norm" in name or ".ln_" in name or name.startswith("ln_"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)


def weights_fingerprint(state: dict[str, Any]) -> str:
    """A short hash of the weights rounded to 1e-6 (names, shapes, values), for comparing across releases."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().float().reshape(-1)
        digest.update(name.encode())
        digest.update(str(tuple(state[name].shape)).encode())
        digest.update(json.dumps([round(v, 6) for v in tensor.tolist()]).encode())
    return digest.hexdigest()[:16]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _split(rows: list[Any], folder: Path, stem: str, sizes: tuple[int, int, int], suffix: str = "json") -> None:
    train, val, test = sizes
    parts = {"train": rows[:train], "validation": rows[train:train + val], "test": rows[train + val:train + val + test]}
    for split, part in parts.items():
        path = folder / f"{stem}_{split}.{suffix}"
        if suffix == "txt":
            path.write_text("".join(line + "\n" for line in part))
        else:
            _write_jsonl(path, part)


def write_data(texts: list[str], vocab: dict[str, int], folder: Path) -> None:
    """Each task's files: ``<task>_{train,validation,test}.json`` (``.txt`` for the language models)."""
    words = [WORD.findall(t) for t in texts]
    known = [w for w in vocab if w not in SPECIALS and w.isalpha() and len(w) > 2]
    _split([{"sentence": t, "label": int(len(w) % 2 == 0)} for t, w in zip(texts, words)], folder, "glue",
           (36, 13, 9))
    _split(texts[40:], folder, "lm", (40, 12, 0), suffix="txt")
    ner = []
    for ws in words[:58]:
        tags = ["O" if not w[0].isupper() else ("I-CAP" if i and ws[i - 1][0].isupper() else "B-CAP")
                for i, w in enumerate(ws)]
        ner.append({"tokens": ws, "ner_tags": tags})
    _split(ner, folder, "ner", (36, 13, 9))
    qa = []
    for i, text in enumerate(texts[:60]):
        ws = text.split()
        pick = ws[len(ws) // 2]
        start = text.index(pick, len(" ".join(ws[:len(ws) // 2])))
        qa.append({"id": f"q{i}", "title": "doc", "context": text, "question": f"what is after {ws[len(ws) // 2 - 1]} ?",
                   "answers": {"text": [pick], "answer_start": [start]}})
    _split(qa, folder, "qa", (36, 13, 9))
    _split([{"text": t, "summary": " ".join(t.split()[:4])} for t in texts[:58]], folder, "summ", (36, 13, 9))
    swag = []
    for i, (text, ws) in enumerate(zip(texts[:58], words)):
        cut = max(2, len(ws) // 2)
        head, right = " ".join(ws[:cut]), " ".join(ws[cut:cut + 4])
        wrong = [" ".join(known[(i * 7 + k * 13) % len(known)] for k in range(j, j + 4)) for j in range(3)]
        label = i % 4
        endings = wrong[:label] + [right] + wrong[label:]
        swag.append({"sent1": head, "sent2": ws[cut - 1], "label": label,
                     **{f"ending{j}": e for j, e in enumerate(endings)}})
    _split(swag, folder, "swag", (36, 13, 9))


def build(folder: Path) -> dict[str, str]:
    """Build the world into ``folder`` (tokenizer in ``tokenizer/``, models in ``model_<task>/``, data files);
    return each model's weights fingerprint."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    texts = sentences()
    vocab = build_vocab(texts)
    build_tokenizer(vocab, folder / "tokenizer")
    write_data(texts, vocab, folder)
    prints = {}
    for seed, (task, (cls_name, config)) in enumerate(sorted(model_specs(len(vocab)).items())):
        torch.manual_seed(seed)
        model = getattr(transformers, cls_name)(config)
        init_weights(model, seed)
        target = folder / f"model_{task}"
        model.save_pretrained(str(target))
        build_tokenizer(vocab, target)
        prints[task] = weights_fingerprint(model.state_dict())
    (folder / "fingerprints.json").write_text(json.dumps(prints, indent=1, sort_keys=True))
    return prints


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1])), indent=1))
