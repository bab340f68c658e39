"""The GPT trainer's reusable parts for PyTorch training loops (docs/python.md, "Training
utilities"):

    from sciattn.training import (AdaptiveGradClipper, DynamicLossScaler,
                                  from_deepspeed_config, tiled_lm_head_cross_entropy)

AdaptiveGradClipper and DynamicLossScaler take DeepSpeed's config objects and run the trainer's
C++ rules; tiled_lm_head_cross_entropy is the LM head and cross-entropy without [N, V] logits.
The optimizer is sciattn.optim.CPUAdamW."""
from .deepspeed_config import DeepSpeedTraining, from_deepspeed_config
from .grad_clip import AdaptiveGradClipper, ClipStep, global_norm
from .lm_head import tiled_lm_head_cross_entropy
from .loss_scaler import DynamicLossScaler

__all__ = [
    "AdaptiveGradClipper",
    "ClipStep",
    "DeepSpeedTraining",
    "DynamicLossScaler",
    "from_deepspeed_config",
    "global_norm",
    "tiled_lm_head_cross_entropy",
]
