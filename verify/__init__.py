"""verify: kernels against dash_ref bit for bit, accuracy, determinism audits, shape fuzzing."""

from dash_ref import __version__

__all__ = ["__version__"]
