"""Post-processing of extractive QA logits, in the shape of upstream's question-answering/utils_qa.py: for every
example, the best-scoring span (start logit + end logit) over all its features, inside the context, at most
``max_answer_length`` tokens, written to ``<prefix>_predictions.json``."""

import collections
import json
import os

import numpy as np


def postprocess_qa_predictions(examples, features, predictions, *, n_best_size=5, max_answer_length=8,
                               output_dir=None, prefix=None):
    """{example id: answer text}; also saved as json in ``output_dir``."""
    all_start, all_end = predictions
    by_example = collections.defaultdict(list)
    index = {k: i for i, k in enumerate(examples["id"])}
    for i, feature in enumerate(features):
        by_example[index[feature["example_id"]]].append(i)
    answers = collections.OrderedDict()
    for e, example in enumerate(examples):
        best = {"score": -np.inf, "text": ""}
        for f in by_example[e]:
            start_logits, end_logits = all_start[f], all_end[f]
            offsets = features[f]["offset_mapping"]
            starts = np.argsort(start_logits)[-1:-n_best_size - 1:-1].tolist()
            ends = np.argsort(end_logits)[-1:-n_best_size - 1:-1].tolist()
            for s in starts:
                for t in ends:
                    if (s >= len(offsets) or t >= len(offsets) or offsets[s] is None or offsets[t] is None
                            or t < s or t - s + 1 > max_answer_length):
                        continue
                    score = float(start_logits[s] + end_logits[t])
                    if score > best["score"]:
                        best = {"score": score, "text": example["context"][offsets[s][0]:offsets[t][1]]}
        answers[example["id"]] = best["text"]
    if output_dir is not None:
        name = "predictions.json" if prefix is None else f"{prefix}_predictions.json"
        with open(os.path.join(output_dir, name), "w") as writer:
            writer.write(json.dumps(answers, indent=4) + "\n")
    return answers
