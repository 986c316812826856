"""Where a training step of the reproducible-training example spends its time, per attention.

For each attention the example's model (``--preset``) trains ``--warmup`` steps, then
``--steps`` steps are timed by the wall clock (the step as the example times it, a
``loss.item()`` at its end), then ``--steps`` more run under ``torch.profiler``, which
gives each step's GPU time: every kernel, and those of the attention (the kernels launched
inside the attention's forward, which runs in a ``record_function`` range, and inside its
backward, an autograd node whose name holds ``Attention`` or ``FlashAttn``). Attentions
take their turns in interleaved rounds::

    python benchmarks/training_profile.py --attention dash sdpa-cudnn sdpa-flash fa4-det \
        --out OUT

writes ``training_profile.json`` and ``training_profile.md``: per attention, the wall time
of a step, the GPU time of its kernels (all, and the attention's forward and backward), and
the step's GPU idle time (wall minus kernels: the host not keeping up, or synchronizations).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from harness import no_cuda, provenance, save_report  # noqa: E402

#: autograd nodes whose kernels are the attention's backward, by a part of their name
BACKWARD_NODES = ("Attention", "FlashAttn")
FORWARD_RANGE = "attention_forward"


class Trainer:
    """One attention's model, optimizer and batches, a step at a time (the example's
    :func:`reproducible_training.train_step`)."""

    def __init__(self, cfg, attention: str, data):
        import reproducible_training as example
        import torch

        self.example, self.torch, self.cfg, self.data = example, torch, cfg, data
        self.attention = attention
        torch.manual_seed(cfg.seed)
        self.model = example.GPT(cfg, attention).cuda()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.1,
                                     foreach=True)
        self.amp = torch.autocast("cuda", dtype=torch.bfloat16)
        self.index = 0

    def step(self) -> float:
        torch = self.torch
        torch.use_deterministic_algorithms(True, warn_only=not self.attention.endswith("-det"))
        batch = self.data[self.index % len(self.data)].cuda()
        self.index += 1
        return self.example.train_step(self.model, self.opt, self.amp, batch, self.cfg.vocab)


def wall_ms(trainer: Trainer, steps: int) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    return (time.perf_counter() - start) * 1e3 / steps


def gpu_ms(trainer: Trainer, steps: int) -> dict[str, float]:
    """GPU milliseconds per step: all kernels, the attention's forward and backward."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            trainer.step()
        torch.cuda.synchronize()
    events = prof.events()
    total = sum(e.device_time_total for e in events
                if e.device_type == torch.autograd.DeviceType.CUDA)
    forward = sum(e.device_time_total for e in events if e.name == FORWARD_RANGE
                  and e.device_type == torch.autograd.DeviceType.CPU)
    backward = sum(e.device_time_total for e in events
                   if e.name.startswith("autograd::engine::evaluate_function")
                   and any(part in e.name for part in BACKWARD_NODES))
    return {"kernels": total / 1e3 / steps, "attention_forward": forward / 1e3 / steps,
            "attention_backward": backward / 1e3 / steps}


def markdown(r: dict) -> str:
    cfg = r["config"]
    lines = ["# A training step's time, per attention", "",
             f"`{r['command']}` at `{r['git_revision']}`, {r['gpu']}. The example's "
             f"`{r['preset']}` model ({cfg['layers']} layers, d_model {cfg['d_model']}, "
             f"{cfg['heads']} heads, sequence {cfg['seqlen']}, batch {cfg['batch']}), "
             f"{r['warmup']} warm-up steps, then per round {r['steps']} steps timed by the "
             f"wall clock and {r['steps']} under `torch.profiler`; {r['rounds']} interleaved "
             "rounds, medians. `kernels`: GPU time of every kernel of a step; `attention`: "
             "the kernels launched inside the attention's forward and backward; `idle`: wall "
             "(median) minus kernels; `least`: the least wall time of a round (a host shared "
             "with other work only adds time). Step time over `dash`'s: above 1, slower than "
             "`dash`.", "",
             "| attention | step ms (wall, median) | step ms (wall, least) | kernels ms "
             "| attention fwd ms | attention bwd ms | idle ms | step / dash (median) "
             "| step / dash (least) |", "|---|---|---|---|---|---|---|---|---|"]
    ours = r["results"].get("dash")
    for name, m in r["results"].items():
        ratios = [f"{m[key] / ours[key]:.3f}" if ours else "-"
                  for key in ("wall_ms", "least_wall_ms")]
        lines.append(f"| {name} | {m['wall_ms']:.2f} | {m['least_wall_ms']:.2f} | "
                     f"{m['kernels']:.2f} | {m['attention_forward']:.2f} | "
                     f"{m['attention_backward']:.2f} | {m['wall_ms'] - m['kernels']:.2f} | "
                     f"{ratios[0]} | {ratios[1]} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import reproducible_training as example

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--attention", nargs="+", choices=example.ATTENTIONS,
                    default=["dash", "sdpa-cudnn", "sdpa-flash"])
    ap.add_argument("--preset", choices=tuple(example.PRESETS), default="small")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)
    if no_cuda("training_profile"):
        return 2
    import torch
    from torch.profiler import record_function

    cfg = example.PRESETS[args.preset]
    attend = example.attend

    def attend_in_range(q, k, v, attention):  # the forward's kernels, by their range
        with record_function(FORWARD_RANGE):
            return attend(q, k, v, attention)
    example.attend = attend_in_range
    data = example.bigram_data(cfg)
    trainers = {}
    for name in args.attention:
        try:
            trainers[name] = Trainer(cfg, name, data)
            for _ in range(args.warmup):
                trainers[name].step()
        except Exception as exc:  # noqa: BLE001 - an attention that cannot run is left out
            print(f"{name}: left out ({type(exc).__name__}: {str(exc)[:120]})")
            trainers.pop(name, None)
    samples = {name: [] for name in trainers}
    for r in range(args.rounds):
        names = list(trainers)
        for name in names[r % len(names):] + names[:r % len(names)]:
            sample = {"wall_ms": wall_ms(trainers[name], args.steps)}
            sample.update(gpu_ms(trainers[name], args.steps))
            samples[name].append(sample)
            print(f"round {r} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in sample.items()),
                  flush=True)
    results = {name: {key: round(statistics.median(s[key] for s in got), 3) for key in got[0]}
               for name, got in samples.items()}
    for name, got in samples.items():  # a host shared with other work only adds wall time
        results[name]["least_wall_ms"] = round(min(s["wall_ms"] for s in got), 3)
    report = {**provenance("training_profile.py", argv), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "preset": args.preset,
              "config": {f: getattr(cfg, f) for f in cfg.__dataclass_fields__},
              "warmup": args.warmup, "steps": args.steps, "rounds": args.rounds,
              "samples": samples, "results": results}
    save_report(args.out, "training_profile", report, markdown(report))
    torch.use_deterministic_algorithms(False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
