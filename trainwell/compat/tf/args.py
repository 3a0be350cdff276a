"""``TFTrainingArguments``: ``TrainingArguments`` plus the TensorFlow fields of the upstream seed.

Pure data like its parent: TensorFlow is imported only when ``strategy`` (or a property that needs it) is first
read, so ``HfArgumentParser(TFTrainingArguments)`` works without TensorFlow installed. The strategy is chosen as
upstream's: ``TPUStrategy`` when ``tpu_name`` is given, ``MirroredStrategy`` over several GPUs, otherwise one
device. One addition: when no GPU is used and the CPU was split into several logical devices
(``tf.config.set_logical_device_configuration``), those become the replicas of a ``MirroredStrategy``.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...args.fields import TrainingArguments, _f, suggest_unknown_arguments

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

logger = logging.getLogger(__name__)


def require_tensorflow() -> Any:
    """Import TensorFlow, or raise an ImportError that says how to install it."""
    try:
        import tensorflow as tf
    except ImportError as err:  # pragma: no cover - exercised only without TensorFlow
        raise ImportError("trainwell.tf needs TensorFlow: pip install 'trainwell[tensorflow]' "
                          "(or pip install tensorflow).") from err
    return tf


@suggest_unknown_arguments
@dataclass
class TFTrainingArguments(TrainingArguments):
    """The arguments of :class:`~trainwell.tf.TFTrainer` (upstream ``transformers.TFTrainingArguments``).

    Every field of :class:`~trainwell.TrainingArguments`, plus ``tpu_name``, ``tpu_zone``, ``gcp_project``,
    ``poly_power`` and ``xla``; parse them with ``HfArgumentParser(TFTrainingArguments)``.
    """

    framework = "tf"
    tpu_name: str | None = _f(None, "Name of the TPU to train on (TPUStrategy).")
    tpu_zone: str | None = _f(None, "Zone of the TPU; detected from the GCE metadata if unset.")
    gcp_project: str | None = _f(None, "Google Cloud project of the TPU; detected from the metadata if unset.")
    poly_power: float = _f(1.0, "Power of the polynomial decay learning-rate schedule.")
    xla: bool = _f(False, "Compile the training and prediction steps with XLA (tf.function(jit_compile=True)).")

    def _check_numbers(self) -> None:
        super()._check_numbers()
        if not self.poly_power > 0:
            raise ValueError(f"poly_power must be > 0 (got {self.poly_power}); 1.0 is a linear decay.")

    def _resolve_misc(self) -> None:
        super()._resolve_misc()
        if self.push_to_hub:  # pushing lives in the torch Trainer (trainwell.trainer.hub)
            raise NotImplementedError("push_to_hub is not supported by TFTrainer; save with trainer.save_model() "
                                      "and upload the folder with huggingface_hub (push_to_hub=False).")

    def _check_precision(self) -> None:
        # The device is TensorFlow's, known only when the strategy is set up (see _setup_strategy).
        if self.fp16 and self.bf16:
            raise ValueError("fp16=True and bf16=True: pick one mixed-precision mode (bf16 on CPU and TPU).")

    # ------------------------------------------------------------------ runtime (lazy, TensorFlow)
    def _setup_strategy(self) -> tf.distribute.Strategy:
        cached = self.__dict__.get("_strategy_cache")
        if cached is not None:
            return cached
        tf = require_tensorflow()
        logger.info("TensorFlow: setting up strategy")
        gpus = [] if self.use_cpu else tf.config.list_physical_devices("GPU")
        if self.tpu_name:
            strategy = self._tpu_strategy(tf)
            policy = "mixed_bfloat16" if (self.fp16 or self.bf16) else None
        else:
            if self.fp16 and not gpus:
                raise ValueError("fp16=True needs a GPU (Keras mixed_float16) and TensorFlow sees none"
                                 + (" (use_cpu=True)" if self.use_cpu else "")
                                 + ": set fp16=False, or bf16=True for mixed_bfloat16 on the CPU.")
            if len(gpus) > 1:
                strategy = tf.distribute.MirroredStrategy()
            elif len(gpus) == 1:
                strategy = tf.distribute.OneDeviceStrategy(device="/gpu:0")
            else:
                cpus = tf.config.list_logical_devices("CPU")
                strategy = (tf.distribute.MirroredStrategy(devices=[d.name for d in cpus]) if len(cpus) > 1
                            else tf.distribute.OneDeviceStrategy(device="/cpu:0"))
            policy = "mixed_float16" if self.fp16 else ("mixed_bfloat16" if self.bf16 else None)
        if policy is not None:
            tf.keras.mixed_precision.set_global_policy(policy)
        self.__dict__["_strategy_cache"] = strategy
        return strategy

    def _tpu_strategy(self, tf: Any) -> tf.distribute.Strategy:
        try:
            tpu = tf.distribute.cluster_resolver.TPUClusterResolver(self.tpu_name, zone=self.tpu_zone,
                                                                    project=self.gcp_project)
            tf.config.experimental_connect_to_cluster(tpu)
            tf.tpu.experimental.initialize_tpu_system(tpu)
        except Exception as err:  # resolver (metadata lookup), connection or TPU init: all mean no TPU here
            raise RuntimeError(f"Couldn't connect to TPU {self.tpu_name!r} (tpu_zone={self.tpu_zone!r}, "
                               f"gcp_project={self.gcp_project!r}): {err}. Check the TPU name, zone and project, "
                               "or leave tpu_name unset to train on the GPUs/CPU.") from err
        return tf.distribute.TPUStrategy(tpu)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_strategy_cache", None)
        return state

    @property
    def strategy(self) -> tf.distribute.Strategy:
        """The ``tf.distribute`` strategy used for training (set up on first use)."""
        return self._setup_strategy()

    @property
    def n_replicas(self) -> int:
        """The number of replicas (CPUs, GPUs or TPU cores) used in this training."""
        return self._setup_strategy().num_replicas_in_sync

    @property
    def n_gpu(self) -> int:
        """Deprecated upstream name of :attr:`n_replicas`."""
        warnings.warn("The n_gpu argument is deprecated and will be removed in a future version, use n_replicas "
                      "instead.", FutureWarning, stacklevel=2)
        return self.n_replicas

    @property
    def train_batch_size(self) -> int:
        """The batch size of one training step over all replicas (per-device size times ``n_replicas``)."""
        return self.per_device_train_batch_size * self.n_replicas

    @property
    def eval_batch_size(self) -> int:
        """The batch size of one evaluation step over all replicas."""
        return self.per_device_eval_batch_size * self.n_replicas
