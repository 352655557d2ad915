"""Build the testbed: data splits, a policy, a smaller draft policy and an outcome reward model, on the CPU.

``build(out_dir, seed)`` runs every stage in order, seeded, on ``torch.set_num_threads(1)`` (on a shared
2-core machine two threads that wait on each other were several times slower than one):

1. **Data** (``generator.py``): calibration / test JSON Lines splits in the GSM8K layout; the train split is
   generated in memory (the manifest keeps its sha256; ``generate(n_train, seed=seed, split="train")``
   rebuilds it).
2. **Policy and draft**: Llama models (``LlamaForCausalLM``) trained from scratch with next-token loss on
   the response only, where the input is exactly what srdq's ``gsm8k`` task feeds a model: the chat
   template of ``math_messages(question)`` with a generation prompt (``HFTokenizer.chat_prompt_ids``),
   then the gold solution (steps and ``\\boxed{n}``) and the EOS token ``<|im_end|>``. With ``init_from``
   (a finished build folder) both are trained further from that build's weights instead of from random
   ones; the manifest's ``init`` records the earlier build's seed, configuration and weights' sha256.
3. **Outcome reward model**: the policy samples ``rm_samples`` responses per calibration problem (T 0.8,
   top-p 0.9, top-k 50); the ``gsm8k`` grader labels each response right or wrong. Every response gives
   several RM examples: prefixes cut after each of its lines and at a random character, and the complete
   response, all with the *outcome* label of the complete response (an ORM on partial and complete
   responses: it learns P(this response ends correct | the text so far)). The RM is a
   ``LlamaForSequenceClassification`` (``num_labels=1``) initialised from the policy's body, trained with
   a logistic loss on the scalar logit of the last token, on exactly the input ``hf-orm`` builds
   (``rewards.hf_orm.rm_chat_ids``: the RM's chat template over user = question, assistant = response, no
   system turn). A fifth of the calibration problems are held out; the manifest reports the RM's AUROC
   on their complete and partial responses.
4. **Evaluation** of the saved (bf16) policy on the test split: greedy and sampled (T 0.8, top-p 0.9,
   top-k 50) single-sample accuracy, per number of steps.
5. **Manifest**: ``manifest.json`` with the sha256 and size of every file, the data and training
   configuration, the timings and the measured figures.

Models are saved in bf16 safetensors. Training is deterministic for a given seed, thread count and
torch build; another build may differ in the last bits (the manifest records the versions).
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from srd_worker.testbed import ARTIFACTS_DIR
from srd_worker.testbed.generator import Difficulty, split_rows

#: Where the committed artifacts live (``srdq testbed build`` writes here by default).
SAMPLING = {"temperature": 0.8, "top_p": 0.9, "top_k": 50}


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int
    steps: int
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 30


@dataclass(frozen=True)
class BuildConfig:
    n_train: int = 16000
    n_calibration: int = 600
    n_test: int = 600
    difficulty: Difficulty = field(default_factory=lambda: Difficulty(max_operand=9, max_value=50))
    policy: ModelConfig = field(
        default_factory=lambda: ModelConfig(
            hidden_size=128,
            layers=3,
            heads=4,
            kv_heads=2,
            intermediate_size=384,
            steps=450,
            batch_size=16,
            lr=1.5e-3,
            warmup=20,
        )
    )
    draft: ModelConfig = field(
        default_factory=lambda: ModelConfig(
            hidden_size=64,
            layers=2,
            heads=2,
            kv_heads=1,
            intermediate_size=192,
            steps=300,
            batch_size=16,
            lr=2e-3,
            warmup=20,
        )
    )
    #: A finished build folder whose ``policy`` and ``draft`` are trained further instead of starting from
    #: random weights (same architecture); None = from scratch. The manifest records that folder's
    #: manifest (its seed, configuration and weights' sha256), so the chain can be rebuilt stage by stage.
    init_from: str | None = None
    #: Which training stage this is (0 = from scratch); offsets the training seeds, so a stage trained
    #: from an earlier one sees the data in another order (the data splits depend on the seed only).
    stage: int = 0
    rm_problems: int = 400
    rm_samples: int = 4
    rm_steps: int = 120
    rm_batch_size: int = 32
    rm_lr: float = 1e-3
    rm_heldout_fraction: float = 0.2
    eval_problems: int = 300
    #: greedy accuracy on this many calibration problems is logged every ``eval_every`` training steps
    #: (0: never); a progress read-out only, not used by the build.
    eval_every: int = 150
    eval_every_problems: int = 100
    max_new_tokens: int = 96
    max_positions: int = 512
    #: One thread: on a shared 2-core machine two threads that wait on each other are several times
    #: slower than one.
    threads: int = 1
    #: Train under ``torch.autocast`` in bf16 (fp32 master weights), several times faster on CPUs with
    #: AMX/AVX512-bf16 and harmless elsewhere.
    autocast_bf16: bool = False


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve (Mann-Whitney, ties count half); None without both classes."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    rank_pos = sum(r for r, y in zip(ranks, labels, strict=True) if y)
    return (rank_pos - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


# --- models ---------------------------------------------------------------------------------------------


def llama_config(cfg: ModelConfig, tokenizer: Any, max_positions: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )


def _lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _batches(lengths: Sequence[int], batch_size: int, steps: int, rng: random.Random) -> list[list[int]]:
    """``steps`` batches of indices, epoch after epoch: each epoch is shuffled, cut into pools of 16
    batches, and each pool sorted by length before it is cut into batches (less padding)."""
    out: list[list[int]] = []
    while len(out) < steps:
        order = list(range(len(lengths)))
        rng.shuffle(order)
        epoch: list[list[int]] = []
        pool = 16 * batch_size
        for s in range(0, len(order) - batch_size + 1, pool):
            chunk = sorted(order[s : s + pool], key=lambda i: lengths[i])
            epoch += [chunk[j : j + batch_size] for j in range(0, len(chunk) - batch_size + 1, batch_size)]
        rng.shuffle(epoch)
        out += epoch
    return out[:steps]


def _autocast(enabled: bool) -> Any:
    """bf16 autocast on the CPU (matmuls in bf16, fp32 master weights), or a no-op."""
    import contextlib

    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def _padded(seqs: Sequence[Sequence[int]], pad: int, fill_labels: Sequence[Sequence[int]] | None = None):
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        if fill_labels is not None:
            labels[i, : len(s)] = torch.tensor(fill_labels[i])
    return ids, mask, labels


def train_lm(
    cfg: ModelConfig,
    tokenizer: Any,
    examples: Sequence[tuple[list[int], list[int]]],
    *,
    seed: int,
    max_positions: int,
    log: Callable[[str], None],
    autocast_bf16: bool = False,
    progress: Callable[[Any, int], None] | None = None,
    progress_every: int = 0,
    init: Any = None,
) -> Any:
    """A LlamaForCausalLM trained on (prompt ids, response ids) pairs, loss on the response only.
    ``progress(model, step)`` is called every ``progress_every`` steps (in eval mode, then back); ``init``
    is a model to train further (fp32) instead of a new one."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = init if init is not None else LlamaForCausalLM(llama_config(cfg, tokenizer, max_positions))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01)
    rng = random.Random(seed)
    seqs = [p + r for p, r in examples]
    labels = [[-100] * len(p) + r for p, r in examples]
    pad = tokenizer.pad_token_id
    t0 = time.perf_counter()
    for step, batch in enumerate(_batches([len(x) for x in seqs], cfg.batch_size, cfg.steps, rng)):
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        ids, mask, lab = _padded([seqs[i] for i in batch], pad, [labels[i] for i in batch])
        with _autocast(autocast_bf16):
            loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == cfg.steps - 1:
            log(f"  step {step:4d}/{cfg.steps} loss {loss.item():.4f} ({time.perf_counter() - t0:.0f}s)")
        if progress is not None and progress_every and step and step % progress_every == 0:
            model.eval()
            progress(model, step)
            model.train()
    model.eval()
    return model


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[int]],
    *,
    greedy: bool,
    seed: int,
    max_new_tokens: int,
    batch_size: int = 128,
) -> list[str]:
    """Responses (decoded, special tokens dropped) to already templated prompts."""
    import torch

    out: list[str] = []
    pad = tokenizer.pad_token_id
    torch.manual_seed(seed)
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, p in enumerate(chunk):  # left padding
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        kwargs: dict[str, Any] = {"do_sample": False} if greedy else {"do_sample": True, **SAMPLING}
        with torch.inference_mode():
            gen = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=pad,
                **kwargs,
            )
        for row in gen[:, width:]:
            out.append(tokenizer.decode(row.tolist(), skip_special_tokens=True))
    return out


# --- the build ------------------------------------------------------------------------------------------


def _prompt_ids(hf_tok: Any, question: str) -> list[int]:
    from srd_worker.tasks.prompts import math_messages

    return hf_tok.chat_prompt_ids(math_messages(question))


def _save(model: Any, tokenizer: Any, path: Path) -> None:
    import torch

    if path.exists():
        shutil.rmtree(path)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    model.to(torch.float32)


def _accuracy(rows: Sequence[dict], correct: Sequence[bool]) -> dict[str, Any]:
    by_steps: dict[int, list[bool]] = {}
    for r, c in zip(rows, correct, strict=True):
        by_steps.setdefault(int(r["steps"]), []).append(bool(c))
    hard = [c for r, c in zip(rows, correct, strict=True) if int(r["steps"]) >= 4]
    return {
        "n": len(rows),
        "accuracy": round(sum(correct) / max(1, len(correct)), 4),
        "hard_steps_4_to_6": {"n": len(hard), "accuracy": round(sum(hard) / max(1, len(hard)), 4)},
        "by_steps": {
            str(k): {"n": len(v), "accuracy": round(sum(v) / len(v), 4)} for k, v in sorted(by_steps.items())
        },
    }


def build(
    out_dir: Path | str = ARTIFACTS_DIR,
    *,
    seed: int = 0,
    config: BuildConfig | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Build every artifact under ``out_dir`` (replacing what is there) and return the manifest."""
    import torch
    import transformers
    from transformers import LlamaForSequenceClassification

    from srd_worker.engines.transformers_engine import HFTokenizer
    from srd_worker.rewards.hf_orm import rm_chat_ids
    from srd_worker.tasks.gsm8k import GSM8KTask
    from srd_worker.testbed.tokenizer import build_tokenizer

    cfg = config or BuildConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    # 1. data: calibration and test are written; train is regenerated from the seed (its sha256 is in the
    # manifest), which keeps the committed artifacts small.
    splits = split_rows(
        seed=seed,
        n_train=cfg.n_train,
        n_calibration=cfg.n_calibration,
        n_test=cfg.n_test,
        difficulty=cfg.difficulty,
    )
    for name in ("calibration", "test"):
        write_jsonl(out / "data" / f"{name}.jsonl", splits[name])
    stale_train = out / "data" / "train.jsonl"
    if stale_train.exists():
        stale_train.unlink()
    log(f"data: {', '.join(f'{k} {len(v)}' for k, v in splits.items())}")

    task = GSM8KTask()

    def grade(rows: Sequence[dict], responses: Sequence[str]) -> list[bool]:
        return [task.grade(resp, _item(r)) for r, resp in zip(rows, responses, strict=True)]

    def _item(row: dict) -> Any:
        from srd_worker.tasks.base import Item

        return Item(id=row["id"], question=row["question"], gold=str(row["final"]), meta={})

    # 2. policy and draft
    tokenizer = build_tokenizer()
    hf_tok = HFTokenizer(tokenizer)
    eos = tokenizer.eos_token_id
    examples = [
        (_prompt_ids(hf_tok, r["question"]), hf_tok.encode(r["solution"]) + [eos]) for r in splits["train"]
    ]
    watch = splits["calibration"][-cfg.eval_every_problems :] if cfg.eval_every_problems else []
    watch_prompts = [_prompt_ids(hf_tok, r["question"]) for r in watch]

    def progress(model: Any, step: int) -> None:
        resp = generate(
            model, tokenizer, watch_prompts, greedy=True, seed=0, max_new_tokens=cfg.max_new_tokens
        )
        acc = _accuracy(watch, grade(watch, resp))
        by = " ".join(f"{k}:{v['accuracy']:.2f}" for k, v in acc["by_steps"].items())
        log(
            f"  step {step}: greedy accuracy {acc['accuracy']:.3f} on {len(watch)} calibration problems ({by})"
        )

    inits: dict[str, Any] = {}
    init_manifest: dict[str, Any] | None = None
    if cfg.init_from:
        from transformers import LlamaForCausalLM

        init_dir = Path(cfg.init_from)
        previous = init_dir / "manifest.json"
        prev = json.loads(previous.read_text(encoding="utf-8")) if previous.is_file() else {}
        for name in ("policy", "draft"):
            inits[name] = LlamaForCausalLM.from_pretrained(init_dir / name, dtype=torch.float32)
        init_manifest = {
            "seed": prev.get("seed"),
            "config": prev.get("config"),
            "init": prev.get("init"),
            "weights_sha256": {
                name: sha256_file(init_dir / name / "model.safetensors") for name in ("policy", "draft")
            },
        }
        log(f"training further from {init_dir}: {init_manifest['weights_sha256']}")
    models: dict[str, Any] = {}
    for name, mcfg, mseed in (
        ("policy", cfg.policy, seed + 100 * cfg.stage),
        ("draft", cfg.draft, seed + 1 + 100 * cfg.stage),
    ):
        t0 = time.perf_counter()
        log(f"{name}: training {mcfg}")
        models[name] = train_lm(
            mcfg,
            tokenizer,
            examples,
            seed=mseed,
            max_positions=cfg.max_positions,
            log=log,
            autocast_bf16=cfg.autocast_bf16,
            progress=progress if watch else None,
            progress_every=cfg.eval_every,
            init=inits.get(name),
        )
        _save(models[name], tokenizer, out / name)
        # evaluate what was saved: bf16 weights (computed in fp32 here)
        models[name].to(torch.bfloat16).to(torch.float32)
        timings[f"train_{name}_s"] = round(time.perf_counter() - t0, 1)

    # 3. evaluation on the test split
    t0 = time.perf_counter()
    test = splits["test"][: cfg.eval_problems]
    test_prompts = [_prompt_ids(hf_tok, r["question"]) for r in test]
    evaluation: dict[str, Any] = {}
    for name in ("policy", "draft"):
        for mode, greedy in (("greedy", True), ("sampled", False)):
            test_resp = generate(
                models[name],
                tokenizer,
                test_prompts,
                greedy=greedy,
                seed=seed + 7,
                max_new_tokens=cfg.max_new_tokens,
            )
            evaluation[f"{name}_{mode}"] = _accuracy(test, grade(test, test_resp))
            log(f"{name} {mode}: {json.dumps(evaluation[f'{name}_{mode}'])}")
    log(f"evaluation took {time.perf_counter() - t0:.0f}s")
    timings["evaluate_s"] = round(time.perf_counter() - t0, 1)

    # 4. reward model
    t0 = time.perf_counter()
    calib = splits["calibration"][: cfg.rm_problems]
    rng = random.Random(seed + 11)
    prompts = [_prompt_ids(hf_tok, r["question"]) for r in calib for _ in range(cfg.rm_samples)]
    rows_rep = [r for r in calib for _ in range(cfg.rm_samples)]
    responses = generate(
        models["policy"], tokenizer, prompts, greedy=False, seed=seed + 13, max_new_tokens=cfg.max_new_tokens
    )
    labels = grade(rows_rep, responses)
    n_held = int(len(calib) * cfg.rm_heldout_fraction)
    held_ids = {r["id"] for r in calib[:n_held]}
    train_x: list[tuple[list[int], float]] = []
    held: dict[str, list[tuple[list[int], bool]]] = {"complete": [], "partial": []}
    for r, resp, y in zip(rows_rep, responses, labels, strict=True):
        cuts = {len(resp)}
        cuts |= {i + 1 for i, ch in enumerate(resp) if ch == "\n"}
        if len(resp) > 1:
            cuts.add(rng.randint(1, len(resp) - 1))
        for c in sorted(cuts):
            ids = rm_chat_ids(tokenizer, r["question"], resp[:c])
            if r["id"] in held_ids:
                held["complete" if c == len(resp) else "partial"].append((ids, y))
            else:
                train_x.append((ids, float(y)))
    sample_acc = sum(labels) / max(1, len(labels))
    log(f"rm data: {len(responses)} samples, {sample_acc:.3f} correct; {len(train_x)} training inputs")

    torch.manual_seed(seed + 17)
    rm_config = llama_config(cfg.policy, tokenizer, cfg.max_positions)
    rm_config.num_labels = 1  # before the model is built: the head is then (1, hidden)
    rm = LlamaForSequenceClassification(rm_config)
    rm.model.load_state_dict(models["policy"].model.state_dict())
    torch.nn.init.zeros_(rm.score.weight)
    rm.train()
    opt = torch.optim.AdamW(rm.parameters(), lr=cfg.rm_lr, weight_decay=0.01)
    pad = tokenizer.pad_token_id

    def rm_logits(model: Any, seqs: Sequence[list[int]]) -> Any:
        ids, mask, _ = _padded(seqs, pad)
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        last = torch.tensor([len(s) - 1 for s in seqs])
        return model.score(hidden[torch.arange(len(seqs)), last])[:, 0]

    for step, batch in enumerate(
        _batches([len(x[0]) for x in train_x], cfg.rm_batch_size, cfg.rm_steps, rng)
    ):
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg.rm_steps, cfg.rm_lr, 20)
        with _autocast(cfg.autocast_bf16):
            logits = rm_logits(rm, [train_x[i][0] for i in batch]).float()
        target = torch.tensor([train_x[i][1] for i in batch])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(rm.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == cfg.rm_steps - 1:
            log(f"  rm step {step:4d}/{cfg.rm_steps} loss {loss.item():.4f}")
    rm.eval()
    _save(rm, tokenizer, out / "rm")
    # transformers' @wraps(nn.Module.to) leaves the stubs' .to unbound (self not filled in)
    rm.to(torch.bfloat16).to(torch.float32)  # type: ignore[arg-type]  # transformers' wrapper hides .to's signature
    rm_eval: dict[str, Any] = {"samples": len(responses), "sample_accuracy": round(sample_acc, 4)}
    with torch.inference_mode():
        for kind, pairs in held.items():
            scores: list[float] = []
            for s in range(0, len(pairs), 64):
                scores += rm_logits(rm, [p[0] for p in pairs[s : s + 64]]).tolist()
            a = auroc(scores, [p[1] for p in pairs])
            rm_eval[f"heldout_{kind}"] = {"n": len(pairs), "auroc": None if a is None else round(a, 4)}
    log(f"rm: {json.dumps(rm_eval)}")
    timings["reward_model_s"] = round(time.perf_counter() - t0, 1)
    timings["total_s"] = round(time.perf_counter() - t_start, 1)

    # 5. manifest
    files = {
        str(p.relative_to(out)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }
    manifest = {
        "seed": seed,
        "config": asdict(cfg),
        "init": init_manifest,
        "train_split": {
            "rows": len(splits["train"]),
            "sha256": hashlib.sha256(
                "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in splits["train"]).encode("utf-8")
            ).hexdigest(),
            "note": "not written: generate(n_train, seed=seed, split='train', difficulty) rebuilds it",
        },
        "parameters": {k: sum(p.numel() for p in m.parameters()) for k, m in (*models.items(), ("rm", rm))},
        "sampling": SAMPLING,
        "evaluation": evaluation,
        "reward_model": {
            "kind": "outcome RM on partial and complete policy samples, labelled by the gsm8k grader",
            **rm_eval,
        },
        "timings": timings,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "files": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest
