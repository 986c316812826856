"""No deadlock: every schedule, mask and worker count completes, on every backend.

A persistent grid waits on semaphores across CTAs, with no forward-progress guarantee
between them; a wrong table or an oversized grid would hang the GPU. Each backend runs its
whole matrix (every schedule x mask x num_workers in {1, 7, 66, the most that can be
resident}) in a child process under a time limit, so a hang fails the test instead of
stopping the suite. A grid larger than what is resident is refused before launch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import sys, torch, dash_cuda
from dash_ref import NAMES
backend = sys.argv[1]
gen = torch.Generator(device="cuda").manual_seed(61)
q, k, v, do = (torch.randn(2, 1000, 4, 64, device="cuda", generator=gen).bfloat16()
               for _ in range(4))
sms = torch.cuda.get_device_properties(0).multi_processor_count
most = None
for w in (4 * sms, 3 * sms, 2 * sms, sms):  # the largest grid the launch accepts
    try:
        o, lse = dash_cuda.attention_forward(q, k, v, backend=backend)
        dash_cuda.attention_backward(q, k, v, o, lse, do, num_workers=w, backend=backend)
        most = w
        break
    except ValueError as e:
        assert "resident" in str(e), e
assert most is not None
for causal in (False, True):
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, backend=backend)
    for name in NAMES:
        for w in (1, 7, 66, most):
            dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal, schedule=name,
                                         deterministic=name != "atomic", num_workers=w,
                                         backend=backend)
    torch.cuda.synchronize()
print("completed", most)
"""


def test_every_schedule_mask_and_worker_count_completes(backend):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, backend], capture_output=True,
                              text=True, env=env, timeout=240)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"backend {backend!r}: the matrix did not complete in 240 s "
                             "(a deadlock)") from None
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("completed")
