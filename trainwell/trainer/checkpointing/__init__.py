"""The Trainer's checkpoint policy: what goes into ``checkpoint-<step>`` and when, resume, preemption, the best model,
``save_model`` and the upstream save/load methods' defaults, runs sharing one ``output_dir``, a remote checkpoint
store, and what the command line reads of a run. The facade (``trainer/trainer.py``) delegates to it; the file format
it writes with is :mod:`trainwell.checkpoint`.

``from trainwell import Trainer`` loads ``checkpoints``, ``checkpoint_store``, ``output_dir_runs``,
``save_load_defaults``, ``preemption_report`` and ``resume_arguments``; they import the modules of
:mod:`trainwell.checkpoint`, the loops and the process group inside the functions that use them, so that the import
loads none of those (``tests/test_overhead_guard.py``: ``DEFERRED_MODULES``)."""
