"""verify: kernels against dash_ref bit for bit, accuracy, determinism audits, shape fuzzing."""
