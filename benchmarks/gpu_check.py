"""GPU check: the transformers engine and the HF ORM adapter at 8B scale, with random weights (no downloads).

On a CUDA machine with torch and transformers, builds a randomly initialised model with the shape of
Llama-3.1-8B (hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336, vocabulary 128256) in
bfloat16 directly on the GPU, and measures

1. generation: ``TransformersEngine.generate`` tokens/s and peak GPU memory
   (``torch.cuda.max_memory_allocated``) at batch sizes 1, 8, 32, 64, in two engine modes side by side:
   ``padded`` (srdq's default settings: one left-padded batch per call, the prefix KV store on) and
   ``invariant`` (the deterministic mode: batch-invariant forward passes of exactly 4 rows, no KV reuse),
   beside transformers' own ``model.generate`` (``library``) as a reference for the engine's loop;
   each request has a 256-token random prompt and samples exactly 128 new tokens (fixed seeds; Best-of-N's
   sampling defaults: temperature 0.8, top-k 50, top-p 0.9; EOS is one id among 128256 and is not expected
   within 128 draws from random weights, and the table reports the tokens actually generated); the time
   includes the prefill, and each row is timed on the second of two identical calls (the first, reported
   beside it, also builds the kernels and attention plans of its shapes);
2. reward scoring: ``HFOutcomeReward.score_ids`` (the ``hf-orm`` adapter's batched path, a
   sequence-classification head with one label on the same 8B shape) in sequences/s and peak memory at a
   few batch sizes, 512-token inputs, one batch per call.

With ``--varied-calls N`` it also runs N calls of new shapes (batch sizes and prompt lengths drawn with a
fixed seed), each with cuDNN attention on and off in alternating order in the one process, and reports each
backend's summed wall time: what a run meeting new shapes pays for cuDNN's per-shape compilation.

The generator is freed before the reward model is built, so each peak is one model's. Prints a table and
writes it into docs/PERFORMANCE.md between the gpu-check markers (``--no-write`` to print only).
On a machine without CUDA it prints why and exits with status 2, writing nothing.

    python benchmarks/gpu_check.py [--batch-sizes 1,8,32,64] [--modes padded,invariant,library]
                                   [--invariant-batch-sizes 1,8,32] [--reward-batch-sizes 1,8,32]
                                   [--no-cudnn-attention] [--varied-calls N] [--section NAME] [--no-write]

Took 2.5 minutes on one H200 with ``--invariant-batch-sizes 1,8,32`` (the invariant mode's batch of 64 would
add about 2 minutes: its 16 passes of 4 rows run one after another).
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402

LLAMA_31_8B = dict(
    hidden_size=4096,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    intermediate_size=14336,
    vocab_size=128256,
)
EOS_ID, PAD_ID = 128001, 128004  # Llama-3.1's <|end_of_text|> and <|finetune_right_pad_id|>


class IdTokenizer:
    """Just enough of a Hugging Face tokenizer for the engine and the RM over raw token ids (no vocabulary
    files: the benchmark never turns text into ids)."""

    eos_token_id, pad_token_id, bos_token_id, chat_template = EOS_ID, PAD_ID, None, None

    def get_vocab(self) -> dict[str, int]:
        return {}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(t)) for t in ids)


#: The modes measured side by side (README, *Engine modes*): each engine mode is the two knobs that
#: define it over the other settings; ``library`` is transformers' own ``model.generate``, for reference.
MODES: dict[str, dict[str, Any] | None] = {
    "padded": dict(batch_invariant=False, kv_reuse=True),
    "invariant": dict(deterministic=True),
    "library": None,
}


def mode_text(mode: str, rows: int) -> str:
    """One mode's line under the table (``rows``: the invariant mode's rows per pass)."""
    return {
        "padded": "`padded` is srdq's default (`SRDQ_BATCH_INVARIANT=false`, `SRDQ_KV_REUSE=true`): one "
        "left-padded batch per call, each finished row's keys and values kept in the prefix store",
        "invariant": f"`invariant` is the deterministic mode (`SRDQ_DETERMINISTIC=true`): forward passes of "
        f"exactly {rows} rows, so a batch of 64 is {-(-64 // rows)} passes one after another, and no KV reuse",
        "library": "`library` is transformers' own `model.generate` on the same prompts and sampling settings "
        "(not an srdq path; a reference for the engine's own loop)",
    }[mode]


def _varied_lines(shapes: list[tuple[int, int]], totals: dict[str, list], new_tokens: int) -> list[str]:
    """The varied-shapes table (nothing when none ran): each backend's summed tokens and wall time over the
    same calls, and their ratio."""
    if not shapes:
        return []
    (tok_on, s_on), (tok_off, s_off) = totals["on"], totals["off"]
    listed = ", ".join(f"{bs}×{plen}" for bs, plen in shapes)
    return [
        f"Varied shapes (padded mode, {len(shapes)} `generate` calls of new shapes, batch × prompt tokens drawn "
        f"with a fixed seed: {listed}; {new_tokens} new tokens per row; each call run twice in one process, once "
        "with cuDNN attention on and once off, in alternating order, the prefix store emptied before each; "
        "each backend meets every shape for the first time, as a run meeting new shapes does):",
        "",
        "| cuDNN attention | calls | generated tokens | wall s | tokens/s |",
        "|---|---:|---:|---:|---:|",
        f"| on | {len(shapes)} | {tok_on} | {s_on:.2f} | {tok_on / s_on:.0f} |",
        f"| off | {len(shapes)} | {tok_off} | {s_off:.2f} | {tok_off / s_off:.0f} |",
        "",
        f"cuDNN on took {s_on / s_off:.2f}× the wall time of cuDNN off over these calls.",
        "",
    ]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def build_config(kind: str, shape: dict, max_positions: int):
    from transformers import LlamaConfig

    # rope_theta and num_labels reach the config through its **kwargs (transformers 5 folds rope_theta into
    # rope_parameters), which its signature does not name
    extra: dict[str, Any] = {"rope_theta": 500000.0, "num_labels": 1 if kind == "rm" else 2}
    return LlamaConfig(
        **shape,
        **extra,
        max_position_embeddings=max_positions,
        bos_token_id=128000,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )


def build_random(auto_cls, config, device: str, dtype):
    """Random weights made directly on ``device`` in ``dtype`` (no fp32 copy on the host)."""
    import torch

    previous = torch.get_default_dtype()
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = auto_cls.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    return model.to(device=device, dtype=dtype).eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default="1,8,32,64")
    ap.add_argument(
        "--invariant-batch-sizes",
        default="",
        help="batch sizes of the invariant mode (default --batch-sizes; its passes of 4 rows run one after "
        "another, so large batches take long)",
    )
    ap.add_argument(
        "--modes",
        default="padded,invariant,library",
        help="engine modes to measure: padded (srdq's default: one padded batch, prefix KV store on), "
        "invariant (the deterministic mode: batch-invariant passes of 4 rows, no KV reuse) and library "
        "(transformers' own model.generate, for reference)",
    )
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument(
        "--varied-calls",
        type=int,
        default=0,
        help="also run this many generate calls of new shapes (batch sizes and prompt lengths drawn with a "
        "fixed seed, as a real run meets them), each twice in one process, with cuDNN attention on and off in "
        "alternating order, and report the summed wall time of each (0: skip)",
    )
    ap.add_argument("--varied-new-tokens", type=int, default=32, help="new tokens per row of a varied call")
    ap.add_argument("--reward-batch-sizes", default="1,8,32")
    ap.add_argument("--reward-tokens", type=int, default=512)
    ap.add_argument("--reward-reps", type=int, default=3, help="timed calls per reward batch size")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "PERFORMANCE.md"))
    ap.add_argument("--no-write", action="store_true", help="print only; leave the doc alone")
    ap.add_argument(
        "--section",
        default="gpu-check",
        help="name of the doc's marker pair to write between (appended to the doc when missing), so a "
        "variant such as --no-cudnn-attention keeps its own table beside the default one",
    )
    ap.add_argument(
        "--no-cudnn-attention",
        action="store_true",
        help="turn off PyTorch's cuDNN attention backend (torch.backends.cuda.enable_cudnn_sdp(False)), so "
        "scaled-dot-product attention takes the flash or memory-efficient kernels: does a first call's cost "
        "(cuDNN compiles attention kernels per new shape) go away? (what SRDQ_CUDNN_ATTENTION=false does in srdq)",
    )
    ap.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="run a tiny shape on the CPU to check the script itself (never writes the doc)",
    )
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        ap.error(f"--modes: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(MODES)}")

    import torch

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing was measured and "
            f"{args.doc} was left unchanged. Run it on a machine with an NVIDIA GPU.",
            file=sys.stderr,
        )
        return 2

    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from srd_worker.engines.base import GenerationRequest, SamplingParams
    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.rewards.hf_orm import HFOutcomeReward
    from srd_worker.settings import Settings

    if args.no_cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(False)
    if args.cpu_smoke:
        device, dtype, write = "cpu", torch.float32, False
        shape = dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            vocab_size=128256,
        )
        gpu_name, shape_name = f"CPU smoke run ({platform.machine()})", "tiny smoke-test"
    else:
        device, dtype, write = "cuda", torch.bfloat16, not args.no_write
        shape = LLAMA_31_8B
        gpu_name, shape_name = torch.cuda.get_device_name(0), "Llama-3.1-8B"

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def reset_peak() -> None:
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib() -> str:
        return f"{torch.cuda.max_memory_allocated() / 2**30:.1f}" if device == "cuda" else "n/a"

    batch_sizes, reward_sizes = _ints(args.batch_sizes), _ints(args.reward_batch_sizes)
    invariant_sizes = _ints(args.invariant_batch_sizes) or batch_sizes
    longest_prompt = args.prompt_tokens * 3 // 2  # of the varied calls
    max_pos = (
        max(args.prompt_tokens + args.new_tokens, longest_prompt + args.varied_new_tokens, args.reward_tokens)
        + 8
    )
    gen = torch.Generator().manual_seed(1234)
    vocab = shape["vocab_size"]

    # ------------------------------------------------------------------ generation
    t0 = time.perf_counter()
    model = build_random(AutoModelForCausalLM, build_config("lm", shape, max_pos), device, dtype)
    build_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())

    def requests(bs: int, new: int, prompt_tokens: int = args.prompt_tokens) -> list[GenerationRequest]:
        out = []
        for i in range(bs):
            ids = torch.randint(0, 128000, (prompt_tokens,), generator=gen).tolist()
            out.append(
                GenerationRequest(
                    tuple(ids),
                    SamplingParams(temperature=0.8, top_k=50, top_p=0.9, max_new_tokens=new, seed=i),
                )
            )
        return out

    def library_generate(lm: Any, reqs: list[GenerationRequest]) -> int:
        """transformers' own ``model.generate`` on the same prompts and sampling settings (a reference
        loop, not an srdq path): the prompts are of one length, so no padding; returns the new tokens."""
        ids = torch.tensor([list(r.prompt_ids) for r in reqs], device=device)
        out = lm.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=0.8,
            top_k=50,
            top_p=0.9,
            max_new_tokens=reqs[0].params.max_new_tokens,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
        )
        return int((out[:, ids.shape[1] :] != PAD_ID).sum())

    gen_rows = []
    for mode in modes:
        knobs = MODES[mode]
        if knobs is None:
            engine = None
            library_generate(model, requests(2, 4))  # warm-up
        else:
            engine = TransformersEngine(
                model,
                IdTokenizer(),
                max_batch_size=max(batch_sizes),
                **TransformersEngine.mode_args(Settings(device=device, **knobs)),
            )
            engine.generate(requests(2, 4))  # warm-up: kernels, allocator
        for bs in invariant_sizes if mode == "invariant" else batch_sizes:
            reqs = requests(bs, args.new_tokens)
            walls = []
            for _ in range(2):  # the first call also builds the kernels and attention plans of its shapes
                if engine is not None:
                    engine.close()  # an empty prefix store: every row is a fresh prompt
                reset_peak()
                sync()
                t = time.perf_counter()
                if engine is None:
                    tokens = library_generate(model, reqs)
                else:
                    tokens = sum(len(g.token_ids) for g in engine.generate(reqs))
                sync()
                walls.append(time.perf_counter() - t)
            cold, dt = walls
            print(
                f"generate {mode} bs={bs}: {tokens} tokens in {dt:.2f}s (first call {cold:.2f}s)",
                file=sys.stderr,
            )
            gen_rows.append(
                (mode, bs, tokens, cold, dt, tokens / dt, dt / args.new_tokens * 1000, peak_gib())
            )
        if engine is not None:
            engine.close()
        del engine

    # ------------------------------------------------------------------ varied shapes, cuDNN on and off
    shape_rng = random.Random(7)
    varied = [
        (shape_rng.randint(2, max(batch_sizes)), shape_rng.randint(args.prompt_tokens // 2, longest_prompt))
        for _ in range(args.varied_calls)
    ]
    varied_totals = {"on": [0, 0.0], "off": [0, 0.0]}  # backend -> [tokens, wall s]
    if varied:
        engine = TransformersEngine(
            model,
            IdTokenizer(),
            max_batch_size=max(bs for bs, _ in varied),
            **TransformersEngine.mode_args(Settings(device=device)),
        )
        for backend in ("on", "off"):
            torch.backends.cuda.enable_cudnn_sdp(backend == "on")
            engine.generate(requests(2, 4))  # warm-up: kernels, allocator
        for k, (bs, plen) in enumerate(varied):
            reqs = requests(bs, args.varied_new_tokens, plen)
            for backend in ("off", "on") if k % 2 == 0 else ("on", "off"):  # ABBA: neither always first
                torch.backends.cuda.enable_cudnn_sdp(backend == "on")
                engine.close()
                sync()
                t = time.perf_counter()
                tokens = sum(len(g.token_ids) for g in engine.generate(reqs))
                sync()
                dt = time.perf_counter() - t
                varied_totals[backend][0] += tokens
                varied_totals[backend][1] += dt
                print(
                    f"varied bs={bs} prompt={plen} cuDNN {backend}: {tokens} tokens in {dt:.2f}s",
                    file=sys.stderr,
                )
        torch.backends.cuda.enable_cudnn_sdp(not args.no_cudnn_attention)
        engine.close()
        del engine
    del model
    if device == "cuda":
        torch.cuda.empty_cache()

    # ------------------------------------------------------------------ reward scoring
    rm_model = build_random(
        AutoModelForSequenceClassification, build_config("rm", shape, max_pos), device, dtype
    )
    rm = HFOutcomeReward(
        "random-8b-rm",
        model=rm_model,
        tokenizer=IdTokenizer(),
        max_tokens_per_batch=max(reward_sizes) * args.reward_tokens,
    )
    rm.score_ids([list(range(1, 9))] * 2)  # warm-up
    rm_rows = []
    for bs in reward_sizes:
        rm.max_tokens_per_batch = bs * args.reward_tokens  # one batch per call
        seqs = [torch.randint(0, vocab - 1, (args.reward_tokens,), generator=gen).tolist() for _ in range(bs)]
        reset_peak()
        sync()
        t = time.perf_counter()
        for _ in range(args.reward_reps):
            scores = rm.score_ids(seqs)
        sync()
        dt = time.perf_counter() - t
        assert len(scores) == bs
        rm_rows.append((bs, bs * args.reward_reps / dt, dt / args.reward_reps * 1000, peak_gib()))
        print(f"reward bs={bs}: {bs * args.reward_reps / dt:.1f} seq/s", file=sys.stderr)

    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {gpu_name}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}. Random weights in the {shape_name} shape ({n_params / 1e9:.2f}B parameters, "
        f"{str(dtype).removeprefix('torch.')}, built in {build_s:.0f} s); no real checkpoint, so the text is noise "
        "and only speed and memory mean anything."
        + (" cuDNN attention turned off (`--no-cudnn-attention`)." if args.no_cudnn_attention else ""),
        "",
        f"Generation (transformers engine, one `generate` call per row: {args.prompt_tokens}-token prompts, "
        f"{args.new_tokens} new tokens each, temperature 0.8, top-k 50, top-p 0.9, fixed seeds; time includes "
        "the prefill; each row is the second of two identical calls, the first, timed as *first call*, also "
        "builds the kernels and attention plans of its shapes):",
        "",
        "| mode | batch | generated tokens | first call s | wall s | tokens/s | ms per step | peak GiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {mode} | {bs} | {tok} | {cold:.2f} | {dt:.2f} | {tps:.0f} | {ms:.1f} | {pk} |"
            for mode, bs, tok, cold, dt, tps, ms, pk in gen_rows
        ],
        "",
        "Modes: " + "; ".join(mode_text(m, Settings(device=device).invariant_rows) for m in modes) + ".",
        "",
        *_varied_lines(varied, varied_totals, args.varied_new_tokens),
        f"Reward scoring (`hf-orm` adapter path, `HFOutcomeReward.score_ids`, one-label sequence-classification head "
        f"on the same shape, {args.reward_tokens}-token inputs, one batch per call, mean of {args.reward_reps} call{'s' if args.reward_reps != 1 else ''}):",
        "",
        "| batch | sequences/s | ms per batch | peak GiB |",
        "|---:|---:|---:|---:|",
        *[f"| {bs} | {sps:.1f} | {ms:.0f} | {pk} |" for bs, sps, ms, pk in rm_rows],
        "",
        f"Command: `python benchmarks/gpu_check.py --batch-sizes {args.batch_sizes} --modes {args.modes} "
        + (f"--invariant-batch-sizes {args.invariant_batch_sizes} " if args.invariant_batch_sizes else "")
        + f"--reward-batch-sizes {args.reward_batch_sizes}"
        + (f" --reward-reps {args.reward_reps}" if args.reward_reps != 3 else "")
        + (f" --varied-calls {args.varied_calls}" if args.varied_calls else "")
        + (
            f" --varied-new-tokens {args.varied_new_tokens}"
            if args.varied_calls and args.varied_new_tokens != 32
            else ""
        )
        + (" --no-cudnn-attention" if args.no_cudnn_attention else "")
        + (f" --section {args.section}" if args.section != "gpu-check" else "")
        + "`",
    ]
    text = "\n".join(lines)
    print(text)
    if write:
        replace_section(Path(args.doc), args.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
