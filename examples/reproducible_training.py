"""Train a small GPT twice per attention and see whether the two runs agree bit for bit.

A 6-layer decoder (d_model 768, 12 heads of 64, causal, sequence 2048, bf16 autocast over
fp32 weights, AdamW) trains for ``--steps`` steps on token sequences drawn with a fixed seed
from a fixed random bigram process (learnable, and nothing to download). Everything but the
attention is made deterministic: seeds, ``torch.use_deterministic_algorithms(True)``
(``warn_only``, so that attentions that do not honour it still run and show it; strict for
the ``-det`` SDPA rows, which ask the backend for its own deterministic mode),
``CUBLAS_WORKSPACE_CONFIG``. Each attention trains twice from the same initial weights on
the same batches; the report gives, per step, both losses and whether they are bitwise
equal, whether all final weights are, and the speed of each run.

Every run is live at once and they take turns, ``--segment`` steps each (default 10), in
an order that rotates from one turn to the next. A turn's time is read between two
synchronizations, so each speed ratio is taken within one turn, where every attention saw
the same machine (the first turn warms up and is not timed): the report's step time over
ours is the median over turns, with its range, and a run's tokens per second count its
timed turns::

    PYTHONPATH=. python examples/reproducible_training.py --out benchmarks/results

writes ``reproducible_training.json``, ``.md`` and ``.png`` (|loss(run 1) - loss(run 2)|
per step on a log scale, exact zeros drawn on their own line; beside it each attention's
step time turn by turn). Without ``--out`` they go to
a new scratch folder (printed), never over the committed results.

``--preset large`` trains a model whose step attention dominates instead
(:data:`LARGE_CONFIG`: 4 layers, d_model 1024, 8 heads of 128, sequence 16384);
``--attention fa4 fa4-det`` adds FlashAttention-4 where it is installed.

``--device cpu`` runs the same harness without a GPU, with PyTorch's math attention and a
tiny model (:data:`CPU_CONFIG`: 2 layers, d_model 64, sequence 64, 40 steps) that trains
twice in a few seconds on two cores; every size flag still overrides it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA initializes

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# ``-det``: the SDPA backend under PyTorch's strict deterministic mode
# (``torch.use_deterministic_algorithms(True)``, not warn-only), which some backends honour
ATTENTIONS = ("dash", "sdpa-cudnn", "sdpa-cudnn-det", "sdpa-flash", "sdpa-flash-det",
              "sdpa-math", "fa4", "fa4-det")


@dataclass(frozen=True)
class Config:
    layers: int = 6
    d_model: int = 768
    heads: int = 12
    seqlen: int = 2048
    vocab: int = 4096
    batch: int = 8
    steps: int = 300
    lr: float = 6e-4
    seed: int = 1234


#: the model ``--device cpu`` trains unless told otherwise: a few seconds on two cores
CPU_CONFIG = Config(layers=2, d_model=64, heads=4, seqlen=64, vocab=256, batch=4, steps=40)
#: ``--preset large``: a model whose step attention dominates, heads of 128 on sequences of
#: 16384: 59 % of the matrix-multiply FLOPs (:func:`attention_share`), where d_model 2048
#: with 16 heads on sequences of 4096 would give 16 % (the small model: 19 %)
LARGE_CONFIG = Config(layers=4, d_model=1024, heads=8, seqlen=16384, batch=1)
PRESETS = {"small": Config(), "large": LARGE_CONFIG}


def attention_share(cfg: Config) -> float:
    """Attention's share of a step's matrix-multiply FLOPs (forward + backward): per token
    and layer ``3.5 * 2 * S * d_model`` for causal attention (half the scores; the backward
    2.5 forwards) against ``6 * 12 * d_model**2`` for the QKV, output and MLP weights, and
    ``6 * d_model * vocab`` for the head once per token."""
    attention = cfg.layers * 3.5 * 2 * cfg.seqlen * cfg.d_model
    weights = cfg.layers * 6 * 12 * cfg.d_model ** 2 + 6 * cfg.d_model * cfg.vocab
    return attention / (attention + weights)
PROGRESS_S = 5.0  # a progress line at least this often while a run trains


# -- data ---------------------------------------------------------------------------------------
def bigram_data(cfg: Config) -> torch.Tensor:
    """``(steps, batch, seqlen + 1)`` tokens of a fixed random bigram process (each token has
    8 possible successors): learnable, generated once, the same for every run."""
    gen = torch.Generator().manual_seed(cfg.seed)
    nexts = torch.randint(0, cfg.vocab, (cfg.vocab, 8), generator=gen)
    rows = cfg.steps * cfg.batch
    tok = torch.empty(rows, cfg.seqlen + 1, dtype=torch.long)
    tok[:, 0] = torch.randint(0, cfg.vocab, (rows,), generator=gen)
    choice = torch.randint(0, 8, (rows, cfg.seqlen), generator=gen)
    for t in range(cfg.seqlen):
        tok[:, t + 1] = nexts[tok[:, t], choice[:, t]]
    return tok.view(cfg.steps, cfg.batch, cfg.seqlen + 1)


# -- model ----------------------------------------------------------------------------------
def attend(q, k, v, attention: str):
    """Causal attention on ``(B, S, H, d)`` tensors by the named implementation."""
    if attention == "dash":
        import dash_cuda

        return dash_cuda.attention(q, k, v, causal=True)
    if attention in ("fa4", "fa4-det"):  # FlashAttention-4 (CuTe DSL), when installed
        from flash_attn.cute import flash_attn_func

        out = flash_attn_func(q, k, v, causal=True, deterministic=attention == "fa4-det")
        return out[0] if isinstance(out, tuple) else out
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION,
               "sdpa-math": SDPBackend.MATH}[attention.removesuffix("-det")]
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


class Block(torch.nn.Module):
    def __init__(self, cfg: Config, attention: str):
        super().__init__()
        self.heads, self.attention = cfg.heads, attention
        self.ln1, self.ln2 = torch.nn.LayerNorm(cfg.d_model), torch.nn.LayerNorm(cfg.d_model)
        self.qkv = torch.nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = torch.nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(cfg.d_model, 4 * cfg.d_model),
                                       torch.nn.GELU(),
                                       torch.nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, -1).unbind(2)
        x = x + self.proj(attend(q, k, v, self.attention).reshape(b, s, -1))
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self, cfg: Config, attention: str):
        super().__init__()
        self.embed = torch.nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = torch.nn.Parameter(torch.zeros(cfg.seqlen, cfg.d_model))
        self.blocks = torch.nn.ModuleList(Block(cfg, attention) for _ in range(cfg.layers))
        self.ln = torch.nn.LayerNorm(cfg.d_model)
        self.head = torch.nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


# -- one training run -------------------------------------------------------------------------
def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, amp, batch: torch.Tensor,
               vocab: int) -> float:
    """One step on ``batch`` (``(B, S + 1)`` tokens: inputs and next-token targets): the
    forward under ``amp``, the loss, the backward and the optimizer's step; the loss."""
    tokens, targets = batch[:, :-1], batch[:, 1:]
    with amp:
        logits = model(tokens)
    loss = F.cross_entropy(logits.float().view(-1, vocab), targets.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


@dataclass
class Run:
    """One training run in progress: its model, optimizer and what it measured so far
    (``seconds``: the wall time of each timed turn, ``steps``: the turn's steps)."""

    attention: str
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    amp: torch.autocast
    losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)


def new_run(cfg: Config, attention: str, device: torch.device) -> Run:
    """A run from the seeded initial weights (every run of ``cfg`` starts from the same)."""
    torch.manual_seed(cfg.seed)
    model = GPT(cfg, attention).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1, foreach=True)
    return Run(attention, model, opt, torch.autocast(device.type, dtype=torch.bfloat16))


def advance(run: Run, cfg: Config, data: torch.Tensor, device: torch.device,
            steps: range) -> float:
    """Train ``run`` over ``steps`` (its next ones); the wall time between two
    synchronizations, so that no other run's queued work is counted."""
    # warn-only lets attentions that ignore the flag run (and show it); "-det" is strict
    torch.use_deterministic_algorithms(True, warn_only=not run.attention.endswith("-det"))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for step in steps:
        run.losses.append(train_step(run.model, run.opt, run.amp, data[step].to(device),
                                     cfg.vocab))
    sync()
    return time.perf_counter() - start


def turns(steps: int, segment: int) -> list[range]:
    """The steps in turns of ``segment`` (at most half the run, so that at least one turn
    after the first, which warms up, is timed)."""
    size = max(1, min(segment, steps // 2))
    return [range(a, min(a + size, steps)) for a in range(0, steps, size)]


def train_interleaved(cfg: Config, attentions: list[str], data: torch.Tensor,
                      device: torch.device, segment: int = 10, log=print
                      ) -> tuple[dict[str, list[Run]], dict[str, str]]:
    """Two runs per attention, all live at once, taking turns of ``segment`` steps in an
    order that rotates each turn: ``(the runs by attention, errors by attention)``, an
    error being the first line of what a step raised (a backend that refuses strict
    determinism); such an attention's runs stop."""
    runs = [new_run(cfg, a, device) for _ in range(2) for a in attentions]
    errors: dict[str, str] = {}
    schedule = turns(cfg.steps, segment)
    last_line = time.perf_counter()
    for turn, steps in enumerate(schedule):
        shift = turn % len(runs)
        for run in runs[shift:] + runs[:shift]:
            if run.attention in errors:
                continue
            try:
                seconds = advance(run, cfg, data, device, steps)
            except RuntimeError as err:
                errors[run.attention] = str(err).splitlines()[0][:200]
                log(f"{run.attention}: {errors[run.attention]}")
                continue
            if turn:  # the first turn warms up (compilation, autotuning, caches)
                run.seconds.append(seconds)
                run.steps.append(len(steps))
        if turn in (0, len(schedule) - 1) or time.perf_counter() - last_line > PROGRESS_S:
            log(f"  step {steps[-1]:4d}: " + ", ".join(
                f"{r.attention} {r.losses[-1]:.4f}" for r in runs[:len(attentions)]
                if r.attention not in errors))
            last_line = time.perf_counter()
    kept: dict[str, list[Run]] = {a: [] for a in attentions if a not in errors}
    for run in runs:
        if run.attention in kept:
            kept[run.attention].append(run)
    return kept, errors


def summary(cfg: Config, run: Run) -> dict:
    """What the report keeps of a finished run: its losses, final weights' digest, tokens
    per second over its timed turns and each timed turn's ms per step."""
    tokens = sum(run.steps) * cfg.batch * cfg.seqlen
    return {"losses": run.losses, "weights": weights_digest(run.model),
            "tokens_per_s": tokens / sum(run.seconds),
            "step_ms": [1e3 * s / n for s, n in zip(run.seconds, run.steps)]}


def compare(attention: str, runs: list[dict]) -> dict:
    a, b = runs
    equal = [x == y for x, y in zip(a["losses"], b["losses"])]
    return {"attention": attention, "loss_run1": a["losses"], "loss_run2": b["losses"],
            "loss_equal": equal, "all_losses_equal": all(equal),
            "first_differing_step": equal.index(False) if False in equal else None,
            "weights_equal": a["weights"] == b["weights"],
            "tokens_per_s": [a["tokens_per_s"], b["tokens_per_s"]],
            "step_ms": [a["step_ms"], b["step_ms"]]}


def turn_ms(row: dict) -> list[float]:
    """A :func:`compare` row's ms per step in each timed turn: the mean of its two runs'."""
    return [(x + y) / 2 for x, y in zip(*row["step_ms"])]


def turn_ratios(row: dict, base: dict) -> list[float]:
    """Per timed turn, ``row``'s step time over ``base``'s (:func:`turn_ms`; above 1:
    ``row`` is slower)."""
    return [x / y for x, y in zip(turn_ms(row), turn_ms(base))]


# -- report ---------------------------------------------------------------------------------
def markdown(report: dict) -> str:
    cfg, rows = report["config"], report["results"]
    lines = [f"# Reproducible training: two runs per attention ({report['environment']})", "",
             f"`{report['command']}`", "",
             f"{cfg['layers']} layers, d_model {cfg['d_model']}, {cfg['heads']} heads, "
             f"sequence {cfg['seqlen']}, batch {cfg['batch']}, {cfg['steps']} steps, bf16 "
             "autocast, AdamW; fixed seeds; `torch.use_deterministic_algorithms(True)`, warn-only "
             "except for the `-det` rows, where it is strict. Attention is "
             f"{100 * attention_share(Config(**cfg)):.0f} % of a step's matrix-multiply FLOPs "
             "(`attention_share`). Every run live at once, taking turns of "
             f"{report.get('segment', '?')} steps in a rotating order; the first turn is not "
             "timed.", "",
             "| attention | losses bitwise equal | first differing step | weights equal | "
             "tokens/s (run 1, run 2) | step ms (median turn) | final loss |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['attention']} | did not run: {r['error']} | | | | | |")
            continue
        lines.append(
            f"| {r['attention']} | {sum(r['loss_equal'])} / {len(r['loss_equal'])} | "
            f"{'-' if r['first_differing_step'] is None else r['first_differing_step']} | "
            f"{'yes' if r['weights_equal'] else 'no'} | {r['tokens_per_s'][0]:,.0f}, "
            f"{r['tokens_per_s'][1]:,.0f} | {statistics.median(turn_ms(r)):.2f} | "
            f"{r['loss_run1'][-1]:.4f} |")
    base = next((r for r in rows if r["attention"] == "dash"), None)
    if base is not None:
        turns_timed = len(base["step_ms"][0])
        lines += ["", f"Step time over `dash`'s, per timed turn (each the mean of the two "
                  f"runs' in that turn), the median over {turns_timed} turns and its range "
                  "(above 1 is slower than `dash`):"]
        for r in (r for r in rows if "error" not in r):
            ratios = turn_ratios(r, base)
            lines.append(f"- {r['attention']}: {statistics.median(ratios):.2f} "
                         f"({min(ratios):.2f} - {max(ratios):.2f})")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    """Left: |loss(run 1) - loss(run 2)| per step; right: each attention's ms per step in
    each timed turn (the mean of its two runs), the turns every ratio is taken within."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, speed) = plt.subplots(1, 2, figsize=(11, 3.6), dpi=120,
                                    gridspec_kw={"width_ratios": (3, 2)})
    floor = 1e-9  # exact zeros are drawn on this line, labelled as such
    rows = [r for r in report["results"] if "error" not in r]
    zero_rows = [r["attention"] for r in rows if r["all_losses_equal"]]
    for r in rows:
        diff = [abs(x - y) for x, y in zip(r["loss_run1"], r["loss_run2"])]
        zero = r["attention"] in zero_rows
        # runs equal at every step share the floor line: the earlier drawn wider beneath
        lw = 1 + 2.5 * (len(zero_rows) - zero_rows.index(r["attention"]) - 1) if zero else 1
        ax.plot(range(len(diff)), [max(d, floor) for d in diff], marker="" if zero else ".",
                ms=3, lw=lw, label=r["attention"] + (" (0 at every step)" if zero else ""))
        per_turn = turn_ms(r)
        speed.plot(range(1, len(per_turn) + 1), per_turn, marker=".", ms=3, lw=1,
                   label=r["attention"])
    ax.set_yscale("log")
    ax.axhline(floor, color="gray", lw=0.6, ls=":")
    ax.text(0, floor * 1.6, "exactly 0", fontsize=8, color="gray")
    ax.set_xlabel("step")
    ax.set_ylabel("|loss(run 1) - loss(run 2)|")
    ax.set_title("Two identical training runs per attention", fontsize=10)
    ax.legend(fontsize=8)
    speed.set_xlabel("timed turn")
    speed.set_ylabel("ms per step")
    speed.set_title("Step time, turn by turn", fontsize=10)
    speed.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for the report (default: a new scratch folder; "
                         "benchmarks/results holds the committed H200 run)")
    ap.add_argument("--attention", nargs="+", choices=ATTENTIONS, default=None,
                    help="default: dash and the SDPA backends on cuda, sdpa-math on cpu")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--preset", choices=tuple(PRESETS), default="small",
                    help="the model on cuda: small (6 x 768, S 2048) or large (4 x 1024, "
                         "heads of 128, S 16384); the size flags override it")
    ap.add_argument("--segment", type=int, default=10,
                    help="steps a run trains per turn before the next run's turn (default 10)")
    for f in Config.__dataclass_fields__.values():
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None,
                        help=f"default {getattr(Config(), f.name)} (cuda, small), "
                             f"{getattr(LARGE_CONFIG, f.name)} (large), "
                             f"{getattr(CPU_CONFIG, f.name)} (cpu)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    base = CPU_CONFIG if device.type == "cpu" else PRESETS[args.preset]
    cfg = Config(**{f: getattr(base, f) if getattr(args, f) is None else getattr(args, f)
                    for f in Config.__dataclass_fields__})
    if args.attention is None:
        args.attention = (["sdpa-math"] if device.type == "cpu" else
                          ["dash", "sdpa-cudnn", "sdpa-cudnn-det", "sdpa-flash",
                           "sdpa-flash-det"])
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="reproducible_training-"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("reproducible_training: no CUDA device (use --device cpu --attention sdpa-math)",
              file=sys.stderr)
        return 2
    if args.segment < 1 or cfg.steps < 2:
        print("reproducible_training: --segment must be at least 1 and --steps at least 2 "
              "(the first turn warms up and is not timed)", file=sys.stderr)
        return 2
    args.attention = list(dict.fromkeys(args.attention))  # each attention once
    if cfg.d_model % cfg.heads:
        print("reproducible_training: d_model must be a multiple of heads", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = False
    data = bigram_data(cfg)
    results = []
    print(f"training {cfg.layers} layers, d_model {cfg.d_model}, sequence {cfg.seqlen}, "
          f"batch {cfg.batch}, {cfg.steps} steps, twice per attention, on {device.type}; "
          f"report to {args.out}", flush=True)
    runs, errors = train_interleaved(cfg, args.attention, data, device, args.segment)
    for attention in args.attention:
        if attention in errors:
            results.append({"attention": attention, "error": errors[attention]})
            continue
        results.append(compare(attention, [summary(cfg, run) for run in runs[attention]]))
        r = results[-1]
        print(f"{attention}: losses equal at {sum(r['loss_equal'])}/{cfg.steps} steps, "
              f"weights {'equal' if r['weights_equal'] else 'differ'}", flush=True)
    env = (torch.cuda.get_device_name() if device.type == "cuda" else "CPU") + \
        f", torch {torch.__version__}"
    segment = len(turns(cfg.steps, args.segment)[0])  # the turns' steps, as run
    report = {"environment": env, "config": asdict(cfg), "segment": segment,
              "results": results,
              "command": "python examples/reproducible_training.py " + " ".join(
                  argv if argv is not None else sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reproducible_training.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "reproducible_training.md").write_text(markdown(report))
    plot(report, args.out / "reproducible_training.png")
    print(markdown(report))
    print(f"wrote {args.out}/reproducible_training.{{json,md,png}}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
