"""The ``train`` section's keys every project has (:class:`LoopSettings`): ``parts.TrainConfig`` adds those of the
optional parts the project has."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from utils.config import Section


class LoopSettings(Section):
    """The ``train`` section's keys every project has: the loop's settings. Intervals are in optimizer steps."""

    seed: int = Field(1234, ge=0, le=2**31 - 1)  # NumPy takes seeds below 2**32, and each rank adds its rank
    precision: Literal["fp32", "tf32", "bf16", "fp16"] = "tf32"  # fp16 uses a GradScaler
    max_steps: int = Field(500000, ge=1)
    grad_accumulation: int = Field(1, ge=1)  # micro-batches per step: batch_size * grad_accumulation * world_size
    grad_clip: Optional[float] = Field(None, ge=0)  # the largest gradient norm; 0: no clipping; None: the recipe's
    log_interval: int = Field(10, ge=1)
    val_interval: int = Field(1000, ge=1)
    checkpoint_interval: int = Field(1000, ge=1)
    keep_last: int = Field(5, ge=0)  # numbered checkpoints kept; 0: all
    on_nonfinite: Literal["skip", "stop"] = "skip"  # a NaN/inf loss or gradient norm: skip the step, or stop
    # an optimizer's updates skipped this many steps in a row (non-finite, spike, fp16 overflow) stop the run; 0: never
    max_skips_in_a_row: int = Field(20, ge=0)
    # a loss or gradient norm above factor x the highest of its last 100 steps (after spike_warmup steps) is a spike,
    # written to anomalies.jsonl with the batch's ids (0: no check); on_spike: log it, skip the step, or stop the run
    spike_factor: float = Field(3.0, ge=0)
    spike_warmup: int = Field(20, ge=1)
    # a rank whose peak memory (compute time per step, 3 log intervals in a row) is this share above the ranks'
    # median is named in a warning (CPU seconds when the ranks compute on the CPU)
    memory_imbalance: float = Field(0.2, gt=0)
    straggler_share: float = Field(0.2, gt=0)
    on_spike: Literal["log", "skip", "stop"] = "log"
    dist_timeout_s: float = Field(600.0, gt=0)  # seconds a collective waits for a hung rank before the run fails
    cudnn_benchmark: Optional[bool] = None  # cuDNN times its algorithms for each new input shape; None: the recipe's
    # train through the model's fast path (Training.optimize_for_training, e.g. torch.compile with static shapes):
    # the same mathematics as eager; the first steps include compilation (tens of seconds on a GPU)
    compile: bool = False
    # an average of the weights inference uses (Inference.modules), ema = decay * ema + (1 - decay) * weights after
    # every real update (training.ema.EMA), for validation and inference; 0: none; typical 0.999; None: the recipe's
    ema_decay: Optional[float] = Field(None, ge=0, lt=1)

    @property
    def sharded(self) -> bool:
        """Whether the run splits its model over the ranks, and saves in their format (never, without a part that
        does)."""
        return False
