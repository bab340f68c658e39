"""Drop-in for ``deepspeed.ops.deepspeed4science``: ``DS4Sci_EvoformerAttention``."""
from .evoformer import DS4Sci_EvoformerAttention

__all__ = ["DS4Sci_EvoformerAttention"]
