"""The README's training loop, runnable: GPU phases held through rlslice, CPU work between.

In one terminal:      rlslice scheduler --auto-create-groups    (or: rlslice up)
In two more:          python examples/quickstart/train_loop.py --job grpo-a
                      python examples/quickstart/train_loop.py --job grpo-b
Watch them alternate: rlslice status gpus-a

`--alone` runs the same loop with no scheduler (the client passes every call through).
The model is a stand-in: each phase sleeps for as long as its GPU or CPU work would take.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import time

from rlslice import Client


def generate(prompts: list[str]) -> list[str]:
    time.sleep(0.3)  # GPU: sampling
    return [p + " ..." for p in prompts]


def score(samples: list[str]) -> list[float]:
    time.sleep(0.5)  # CPU: reward model on CPU, verifiers, sandboxes
    return [random.random() for _ in samples]


def train_step(samples: list[str], rewards: list[float]) -> float:
    time.sleep(0.3)  # GPU: forward, backward, optimizer step
    return sum(rewards) / len(rewards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="grpo-7b")
    parser.add_argument("--group", default="gpus-a")
    parser.add_argument(
        "--scheduler", default=os.environ.get("RLSLICE_SCHEDULER", "127.0.0.1:50551")
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--alone", action="store_true", help="run without a scheduler")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.alone:
        os.environ.pop("RLSLICE_SCHEDULER", None)
    prompts = [f"prompt {i}" for i in range(8)]

    # The README's ten lines, with the scheduler address taken from the command line.
    client = Client(
        job=args.job, group=args.group, scheduler=None if args.alone else args.scheduler
    )
    for step in range(args.steps):
        with client.phase("rollout") as grant:
            samples = generate(prompts)  # GPU
        rewards = score(samples)  # CPU: another job may use the GPUs now
        with client.phase("train"):
            loss = train_step(samples, rewards)  # GPU
        print(
            f"{args.job} step {step}: loss {loss:.3f}, waited {grant.waited_seconds:.2f} s for rollout"
        )
    client.close()


if __name__ == "__main__":
    main()
