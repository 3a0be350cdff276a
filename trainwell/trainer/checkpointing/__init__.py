"""The Trainer's checkpoint policy: what goes into ``checkpoint-<step>`` and when, resume, preemption, the best model,
``save_model`` and the upstream save/load methods' defaults, runs sharing one ``output_dir``, a remote checkpoint
store, and what the command line reads of a run. The facade (``trainer/trainer.py``) delegates to it; the file format
it writes with is :mod:`trainwell.checkpoint`."""
