"""Train the arithmetic DSA model on CPU: ``python -m dsa_route.tiny.arith.train [--minutes 80] [--out DIR]``.

The DeepSeek-V3.2 recipe scaled down (DeepSeek-V3.2-Exp tech report §2.1, "Continued Pre-Training"; formulas in
:mod:`.batched`), from scratch instead of from a dense checkpoint:

1. dense warm-up (the first ``--dense-frac`` of the schedule): every query attends to all causal keys; the language
   model learns the task while the lightning indexer, on detached inputs, is fitted by KL to the main attention's
   head-summed distribution;
2. sparse training (the rest): each query attends only to the indexer's top-``index_topk`` keys, the indexer's KL
   restricted to that selected set.
Throughout: next-token loss (prompt tokens weighted ``--prompt-weight``, the worked answer and ``<|eos|>`` 1) plus the
MTP next-next-token loss × ``--mtp-weight`` (DeepSeek-V3 §2.2 uses λ = 0.3 early in training).

AdamW (β 0.9/0.95, weight decay on matrices), linear warm-up then cosine decay to 10 %, gradient clipping at 1, fp32
master weights and bf16 autocast (``--precision bf16``, the committed checkpoint's recipe) or fp32 throughout
(``--precision fp32``: on a CPU without bf16 matrix instructions — this AVX2 VM — a bf16 matmul runs at 2.6 GFLOPS
against 20–34 in fp32, measured 2026-12-05, so a long batch trains ≈ 4.5× faster in fp32; the same maths, in more
precision). The schedule runs on *progress* = ``step / --steps`` when ``--steps`` is given,
else ``training seconds / (--minutes · 60)`` (a wall-clock budget on a shared machine); the phase switch and the
learning rate follow progress, and training stops at progress 1.

Long problems (``--distractors MIN MAX``, :func:`.task.make_problem`'s distractor range; default 4 8, the committed
checkpoint's) make prompts several times ``index_topk``. ``--init CKPT`` starts from a checkpoint's weights (a
fine-tune; its tokenizer must be this one) instead of ``--seed``'s random ones. ``--micro-tokens N`` splits each batch
into length buckets of at most N padded tokens (rows sorted by length), so short problems are not padded to the
longest one: the loss is still the whole batch's (:func:`batch_loss`: sums over the buckets, divided once), so the
gradient is the unsplit batch's up to rounding, at a fraction of the attention's S² work.

Seeded (``--seed``: weights, and the problem stream), resumable (``<work>/state.pt``: weights, optimizer, step,
elapsed time, the problem stream's RNG state; a rerun with the same ``--work`` continues), a progress bar, the loss
curve in ``<work>/loss.jsonl``. The HF-format checkpoint (:func:`.model.export_checkpoint`) is exported to ``--out``
at every save and at the end, with ``train.json`` (the command, every invocation that trained this state with the
step it started from, arguments, steps, wall time, last losses).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import sys
import time
from pathlib import Path

import torch

from dsa_route.dsa import DsaForCausalLM

from .batched import forward_train, lm_loss_sums, tie_mtp_
from .model import CHECKPOINT_DIR, arith_config, export_checkpoint
from .task import completion_text, generate, make_problem, prompt_text
from .tokenizer import EOS_ID, train_tokenizer, vocab_size_of

TOKENIZER_SEED, TOKENIZER_PROBLEMS = 12345, 20000
LOG_EVERY = 10


def build_tokenizer():
    """The task tokenizer, trained on a fixed seeded corpus (the same tokenizer on every run)."""
    return train_tokenizer(prompt_text(p.question) + completion_text(p.answer)
                           for p in generate(TOKENIZER_PROBLEMS, TOKENIZER_SEED))


def encode_batch(tok, problems, prompt_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``<|bos|> prompt completion <|eos|>`` per problem, right-padded → ``(ids long [B,S], lengths long [B],
    weights fp32 [B,S])``; the weight of token s is the weight of predicting it (0 for BOS and padding)."""
    rows, weights = [], []
    for p in problems:
        prompt = tok.encode(prompt_text(p.question)).ids  # starts with <|bos|>
        answer = tok.encode(completion_text(p.answer), add_special_tokens=False).ids + [EOS_ID]
        rows.append(prompt + answer)
        weights.append([0.0] + [prompt_weight] * (len(prompt) - 1) + [1.0] * len(answer))
    S = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), S, dtype=torch.long)
    w = torch.zeros(len(rows), S)
    for i, (r, wr) in enumerate(zip(rows, weights)):
        ids[i, :len(r)] = torch.tensor(r)
        w[i, :len(r)] = torch.tensor(wr)
    return ids, torch.tensor([len(r) for r in rows]), w


def length_buckets(lengths: torch.Tensor, max_tokens: int) -> list[torch.Tensor]:
    """Row indices ``long [n]`` of each bucket of a batch with ``lengths long [B]``: rows in descending length, a new
    bucket whenever one more row would take ``rows × its longest length`` past ``max_tokens`` (a row longer than
    that is a bucket alone); ``max_tokens <= 0``: one bucket of every row, in order."""
    if max_tokens <= 0:
        return [torch.arange(len(lengths))]
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    buckets, current = [], []
    for row in order:
        if current and (len(current) + 1) * int(lengths[current[0]]) > max_tokens:
            buckets.append(torch.tensor(current))
            current = []
        current.append(row)
    return buckets + [torch.tensor(current)]


def batch_loss(model: DsaForCausalLM, ids: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor, *,
               sparse: bool, mtp_weight: float, max_tokens: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
    """The training loss of one batch (``ids long [B,S]``, ``lengths long [B]``, ``weights fp32 [B,S]`` from
    :func:`encode_batch`): ``lm + mtp_weight · mtp + indexer KL`` (fp32 scalar, with autograd) and its parts
    (``lm``, ``mtp``, ``indexer_kl`` floats). The batch runs in :func:`length_buckets` of ``max_tokens``, each
    trimmed to its longest row; the means are taken over the whole batch (summed cross-entropies over summed
    weights, per layer summed query KLs over summed rows), so the loss is the unsplit batch's."""
    sums, kl_sum, rows = torch.zeros(4), 0.0, 0.0
    for bucket in length_buckets(lengths, max_tokens):
        S = int(lengths[bucket].max())
        part_ids, part_lengths = ids[bucket, :S], lengths[bucket]
        out = forward_train(model, part_ids, part_lengths, sparse=sparse)
        sums = sums + lm_loss_sums(out, part_ids, weights[bucket, :S])
        kl_sum, rows = kl_sum + out.indexer_kl_sum, rows + out.indexer_rows
    lm, mtp = sums[0] / sums[1].clamp_min(1e-9), sums[2] / sums[3].clamp_min(1e-9)
    kl = (kl_sum / rows.clamp_min(1)).mean()
    return lm + mtp_weight * mtp + kl, {"lm": lm.item(), "mtp": mtp.item(), "indexer_kl": kl.item()}


def learning_rate(progress: float, step: int, peak: float, warmup_steps: int) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine from ``peak`` to ``0.1 · peak`` over progress [0, 1]."""
    warm = min(1.0, (step + 1) / warmup_steps)
    return peak * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed_tokens" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed_tokens" not in n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dsa_route.tiny.arith.train", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(CHECKPOINT_DIR), help="HF-format checkpoint directory (default: %(default)s)")
    ap.add_argument("--work", default="arith-train", help="training state and loss log (resume from here)")
    ap.add_argument("--minutes", type=float, default=80.0, help="wall-clock training budget (used without --steps)")
    ap.add_argument("--steps", type=int, default=0, help="fixed number of steps (overrides --minutes)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--dense-frac", type=float, default=0.3, help="fraction of the schedule trained dense")
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--prompt-weight", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", default=None, help="start from this checkpoint's weights (a fine-tune)")
    ap.add_argument("--distractors", type=int, nargs=2, metavar=("MIN", "MAX"), default=(4, 8),
                    help="distractor sentences per training problem (default %(default)s)")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                    help="bf16 autocast (default, the committed recipe) or fp32 throughout")
    ap.add_argument("--micro-tokens", type=int, default=0,
                    help="split each batch into length buckets of at most this many padded tokens (0: one)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save-minutes", type=float, default=5.0, help="save state + export every this many minutes")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.steps < 0 or args.minutes <= 0 or args.batch <= 0 or not 0 <= args.dense_frac <= 1:
        ap.error("need --steps >= 0, --minutes > 0, --batch > 0 and 0 <= --dense-frac <= 1")
    if not 0 <= args.distractors[0] <= args.distractors[1]:
        ap.error("--distractors needs 0 <= MIN <= MAX")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    config = arith_config(vocab_size_of(tok))
    model = DsaForCausalLM(config).init_random(args.seed)
    if args.init:
        if not (Path(args.init) / "config.json").is_file():
            print(f"--init {args.init}: no checkpoint (config.json missing)", file=sys.stderr)
            return 2
        init = DsaForCausalLM.from_pretrained(args.init, dtype=torch.float32)
        if init.config.to_hf_config() != config.to_hf_config():
            print(f"--init {args.init}: another geometry or vocabulary than this model's (config.json differs)",
                  file=sys.stderr)
            return 2
        model.load_state_dict(init.state_dict())
    opt = make_optimizer(model, args.lr, args.weight_decay)
    rng = random.Random(args.seed)
    step, elapsed, history = 0, 0.0, []
    state_file = work / "state.pt"
    if state_file.is_file():
        state = torch.load(state_file, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        rng.setstate(state["rng"])
        step, elapsed, history = state["step"], state["elapsed"], state.get("history", [])
        print(f"resumed from {state_file} at step {step} ({elapsed / 60:.1f} min trained)", file=sys.stderr)
    command = "python -m dsa_route.tiny.arith.train " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    history.append({"command": command, "from_step": step})

    def progress() -> float:
        return step / args.steps if args.steps else elapsed / (args.minutes * 60)

    def save(last: dict) -> None:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": rng.getstate(), "step": step,
                    "elapsed": elapsed, "history": history}, work / "state.tmp")
        (work / "state.tmp").replace(state_file)
        tie_mtp_(model)
        record = {"command": command, "invocations": history, "seed": args.seed, "args": vars(args), "steps": step,
                  "train_minutes": round(elapsed / 60, 2), "progress": round(progress(), 4), "last": last,
                  "tokenizer": {"seed": TOKENIZER_SEED, "problems": TOKENIZER_PROBLEMS}}
        out = export_checkpoint(model, tok, args.out, record=record)
        (out / "loss.jsonl").write_text((work / "loss.jsonl").read_text() if (work / "loss.jsonl").exists() else "")

    bar = None if args.no_progress else _progress_bar()
    last: dict = {}
    last_save = time.monotonic()
    log = (work / "loss.jsonl").open("a")
    while progress() < 1.0:
        t0 = time.monotonic()
        sparse = progress() >= args.dense_frac
        lr = learning_rate(progress(), step, args.lr, args.warmup_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        low, high = args.distractors
        problems = [make_problem(rng, min_distractors=low, max_distractors=high) for _ in range(args.batch)]
        ids, lengths, weights = encode_batch(tok, problems, args.prompt_weight)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss, parts = batch_loss(model, ids, lengths, weights, sparse=sparse, mtp_weight=args.mtp_weight,
                                     max_tokens=args.micro_tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        dt = time.monotonic() - t0
        elapsed += dt
        last = {"step": step, "phase": "sparse" if sparse else "dense", "lr": round(lr, 6),
                **{k: round(v, 4) for k, v in parts.items()},
                "tok_s": round(int(lengths.sum()) / dt), "minutes": round(elapsed / 60, 2)}
        if step % LOG_EVERY == 0:
            log.write(json.dumps(last) + "\n")
            log.flush()
        if bar is not None:
            bar.update(progress(), last)
        if time.monotonic() - last_save > args.save_minutes * 60:
            save(last)
            last_save = time.monotonic()
    log.close()
    save(last)
    if bar is not None:
        bar.close()
    print(json.dumps(last))
    return 0


class _progress_bar:
    """tqdm over progress in per mille, with the latest losses as postfix."""

    def __init__(self):
        from tqdm import tqdm

        self.bar = tqdm(total=1000, unit="‰", dynamic_ncols=True)

    def update(self, progress: float, last: dict) -> None:
        self.bar.n = min(1000, int(progress * 1000))
        self.bar.set_postfix({k: last[k] for k in ("step", "phase", "lm", "mtp", "indexer_kl", "tok_s")}, refresh=True)

    def close(self) -> None:
        self.bar.close()


if __name__ == "__main__":
    sys.exit(main())
