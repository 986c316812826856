"""dash_cuda: Hopper kernels for a deterministic attention backward that runs dash_ref schedules.

``attention`` is a drop-in autograd function; ``attention_forward`` / ``attention_backward``
expose the two passes (the backward with an ``audit`` mode that returns every fp32 dQ
partial). Importing this package needs neither CUDA nor Triton: kernels load on first use.
"""

from .api import LAYOUTS, attention, attention_backward, attention_forward
from .config import HEAD_DIMS

__all__ = ["HEAD_DIMS", "LAYOUTS", "attention", "attention_backward", "attention_forward"]
