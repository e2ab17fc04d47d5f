"""One real `trl.GRPOTrainer` job with the two lines of rlslice, for test_trl_pair.py.

    python trl_job.py --seed 1 --steps 3 --out result.json [--barrier DIR] [--job grpo-a]
        [--phase rollout --hold train --offer asked --await-yield-request]

A tiny Llama and a word-level tokenizer are built from a config (no download); the prompts
and the reward are made up here. With `RLSLICE_SCHEDULER` set the job runs under
`GpuPhaseCallback(offload=True)`; without it the callback passes through (the run alone).
After `train()` it saves the model with `trainer.save_model()` and reads the saved file
back. Writes JSON: per-step log history (floats as hex), SHA-256 of the weights in memory
and of the saved file, every grant the callback got, and its early yields.

`--phase/--hold/--offer` configure the callback (the rollout side of a rollout/train
split: `--phase rollout --hold train --offer asked`). `--await-yield-request` makes the
first step end wait (up to 60 s) until the scheduler asks the job to yield, so the split
pair really exercises an early yield however fast the steps run (under a scheduler only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from rlslice.integrations.trl import GpuPhaseCallback

WORDS = [f"w{i}" for i in range(28)]


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {word: i for i, word in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=inner,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
    )


def model(vocab: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(config)


def reward_even_words(completions: list[str], **kwargs: Any) -> list[float]:
    """Made up and deterministic: the share of words with an even number."""
    scores = []
    for text in completions:
        words = [w for w in text.split() if w.startswith("w")]
        scores.append(sum(int(w[1:]) % 2 == 0 for w in words) / max(1, len(words)))
    return scores


def sha256_of(state: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        # A copy: `.numpy()` of the parameter itself would pin its storage for good.
        data = state[name].detach().to("cpu", copy=True).contiguous()
        digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def wait_at_barrier(folder: Path, job: str, timeout: float = 120.0) -> None:
    """Say this job is ready, then wait until the test lets every job go (a file appears).
    Both jobs then start their loops together, so they really contend."""
    (folder / f"{job}.ready").touch()
    deadline = time.monotonic() + timeout
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test did not release the barrier")
        time.sleep(0.005)


class Grants:
    """Records the rlslice callback's grant at each step (it runs after the callback)."""

    def __init__(self, callback: GpuPhaseCallback) -> None:
        self.callback = callback
        self.seen: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        grant = self.callback.last_grant
        if grant is not None and len(self.seen) < self.callback.grants:
            self.seen.append(
                {
                    "epoch": grant.epoch,
                    "waited_seconds": grant.waited_seconds,
                    "restored": grant.restored,
                    "moved_bytes": grant.moved_bytes,
                    "switch_seconds": grant.switch_seconds,
                    "disabled": grant.disabled,
                }
            )


class AwaitYieldRequest:
    """At the first step end, wait until the scheduler asks the job to yield (it runs
    before the rlslice callback, which then gives the group up at that same step end)."""

    def __init__(self, callback: GpuPhaseCallback) -> None:
        self.callback = callback
        self.waited = False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        if self.waited or self.callback.client().disabled:
            return
        self.waited = True
        deadline = time.monotonic() + 60
        while not self.callback.should_yield():
            if time.monotonic() > deadline:
                raise TimeoutError("the scheduler never asked the rollout to yield")
            time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--barrier", type=Path)
    parser.add_argument("--job", default=os.environ.get("RLSLICE_JOB", "alone"))
    parser.add_argument("--phase", default="train")
    parser.add_argument("--hold", default="step", choices=["step", "train"])
    parser.add_argument("--offer", default="step", choices=["step", "asked"])
    parser.add_argument("--await-yield-request", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    tok = tokenizer()
    policy = model(len(tok))
    prompts = [" ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(3)) for i in range(8)]
    dataset = Dataset.from_dict({"prompt": prompts})
    output = args.out.parent / f"{args.job}-output"
    config = GRPOConfig(
        output_dir=str(output),
        max_steps=args.steps,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=args.seed,
        dataloader_num_workers=0,
    )

    # The two lines: the callback registers the model and the optimizer itself.
    with GpuPhaseCallback(
        offload=True, phase=args.phase, hold=args.hold, offer=args.offer
    ) as rlslice_callback:
        grants = Grants(rlslice_callback)
        callbacks: list[Any] = [rlslice_callback, grants]
        if args.await_yield_request:
            callbacks.insert(0, AwaitYieldRequest(rlslice_callback))
        trainer = GRPOTrainer(
            model=policy,
            reward_funcs=reward_even_words,
            args=config,
            train_dataset=dataset,
            processing_class=tok,
            callbacks=callbacks,
        )
        if args.barrier is not None:
            wait_at_barrier(args.barrier, args.job)
        trainer.train()
        left_with = {"held": rlslice_callback.held, "grants": rlslice_callback.grants}
        early_yields = rlslice_callback.early_yields
        offloader = rlslice_callback.offloader

    # After train(): the weights are home; saving reads them.
    empty = [name for name, p in policy.named_parameters() if p.untyped_storage().nbytes() == 0]
    trainer.save_model(str(output / "final"))
    from safetensors.torch import load_file

    saved = load_file(str(output / "final" / "model.safetensors"))
    history = [
        {k: v.hex() if isinstance(v, float) else v for k, v in row.items()}
        for row in trainer.state.log_history
        if "loss" in row
    ]
    result = {
        "job": args.job,
        "seed": args.seed,
        "history": history,
        "weights_sha256": sha256_of(policy.state_dict()),
        "saved_matches": sorted(saved) == sorted(policy.state_dict())
        and all(torch.equal(saved[k], v) for k, v in policy.state_dict().items()),
        "empty_parameters": empty,
        "grants": grants.seen,
        "left_with": left_with,
        "early_yields": early_yields,
        "offloader_tags": list(offloader.tags) if offloader is not None else [],
        "offloaded_after_train": bool(offloader is not None and offloader.offloaded),
    }
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
