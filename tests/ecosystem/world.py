"""The offline world of the ecosystem tests: a word-level tokenizer and a tiny Llama (every dropout 0, weights from
a fixed seed) saved into a folder, and small text / preference data sets. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

WORDS = ("the cat dog sat ran on mat rug a big small red blue quick slow fox jumps over lazy bird sings "
         "song tree sun moon star sky sea ship sails far near home good bad is was very").split()
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]

SENTENCES = [
    "the cat sat on the mat", "a big dog ran on the rug", "the quick fox jumps over the lazy dog",
    "a small bird sings a song", "the sun is very big", "the red ship sails far", "a blue star in the sky",
    "the moon was near the sea", "the slow dog sat home", "a good cat ran far", "the lazy fox was bad",
    "the big tree is near home", "a red bird sat on a tree", "the ship was very slow", "the sky is blue",
    "a cat and a dog", "the sea was very big", "a quick bird is good",
]


def build_tokenizer(folder: Path) -> None:
    """A Llama-shaped fast tokenizer (``<s>`` prepended, ``</s>`` as eos and ``<pad>`` for padding) saved into
    ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS + ["and"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=64)
    fast.save_pretrained(str(folder))


def build_tiny_llama(folder: Path, seed: int = 0) -> Path:
    """A 2-layer Llama (hidden 16) and the tokenizer above, saved into ``folder``; returns ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    build_tokenizer(folder)
    config = LlamaConfig(vocab_size=len(SPECIALS) + len(WORDS) + 1, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(str(folder))
    return folder


def text_rows() -> list[dict[str, str]]:
    """Language-modelling rows: ``{"text": ...}``."""
    return [{"text": s} for s in SENTENCES]


def preference_rows() -> list[dict[str, str]]:
    """DPO rows: a prompt and a chosen and a rejected continuation."""
    rows = []
    for i, sentence in enumerate(SENTENCES[:12]):
        words = sentence.split()
        other = SENTENCES[(i + 5) % len(SENTENCES)].split()
        rows.append({"prompt": " ".join(words[:2]), "chosen": " ".join(words[2:]), "rejected": " ".join(other[2:])})
    return rows


def build_tiny_bert(folder: Path, seed: int = 0) -> Path:
    """A 1-layer BERT with its masked-LM head (hidden 16) and the tokenizer above, saved into ``folder`` (the
    base of the sentence-transformers models: dense, cross, sparse and multi-vector encoders); returns ``folder``."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    build_tokenizer(folder)
    config = BertConfig(vocab_size=len(SPECIALS) + len(WORDS) + 1, hidden_size=16, intermediate_size=32,
                        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64, pad_token_id=0,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    BertForMaskedLM(config).save_pretrained(str(folder))
    return folder
