"""dash_cuda: Hopper kernels for a deterministic attention backward that executes dash_ref schedules."""
