"""The GPT trainer's reusable parts for PyTorch training loops (docs/python.md, "Training
utilities"):

    from sciattn.training import AdaptiveGradClipper, DynamicLossScaler, from_deepspeed_config

AdaptiveGradClipper and DynamicLossScaler take DeepSpeed's config objects and run the trainer's
C++ rules.
The optimizer is sciattn.optim.CPUAdamW."""
from .deepspeed_config import DeepSpeedTraining, from_deepspeed_config
from .grad_clip import AdaptiveGradClipper, ClipStep, global_norm
from .loss_scaler import DynamicLossScaler

__all__ = [
    "AdaptiveGradClipper",
    "ClipStep",
    "DeepSpeedTraining",
    "DynamicLossScaler",
    "from_deepspeed_config",
    "global_norm",
]
