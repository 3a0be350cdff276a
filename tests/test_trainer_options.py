"""Options of the training loop that touch evaluation and accounting: eval_on_start, eval_delay, tokens seen."""

from __future__ import annotations

from trainwell import Trainer


def _eval_steps(trainer: Trainer) -> list[int]:
    return [entry["step"] for entry in trainer.state.log_history if "eval_loss" in entry]


def test_eval_on_start_evaluates_before_the_first_step(tiny, make_args):
    data = tiny.regression_data(32)
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(eval_on_start=True, eval_strategy="epoch",
                                                                   num_train_epochs=2),
                      train_dataset=data, eval_dataset=data[:8])
    trainer.train()
    assert _eval_steps(trainer) == [0, 4, 8]


def test_eval_delay_skips_early_evaluations(tiny, make_args):
    data = tiny.regression_data(32)
    args = make_args(eval_strategy="steps", eval_steps=2, eval_delay=5, max_steps=8)
    trainer = Trainer(model=tiny.RegressionModel(), args=args, train_dataset=data, eval_dataset=data[:8])
    trainer.train()
    assert _eval_steps(trainer) == [6, 8]


def test_num_input_tokens_seen_counts_every_micro_batch(tiny, make_args):
    data = tiny.token_data(32, seq=6)
    args = make_args(include_num_input_tokens_seen=True, num_train_epochs=1, gradient_accumulation_steps=2,
                     logging_steps=1)
    trainer = Trainer(model=tiny.TokenLM(), args=args, train_dataset=data)
    trainer.train()
    assert trainer.state.num_input_tokens_seen == 32 * 6
    logged = [e["num_input_tokens_seen"] for e in trainer.state.log_history if "loss" in e]
    assert logged == [96, 192]
