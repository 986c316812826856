"""verify: prove kernels match dash_ref bit for bit, measure accuracy, audit determinism, fuzz shapes."""
