"""Where rlslice's two lines go in the frameworks people train with.

- `rlslice.integrations.ray`: `@gpu_phase("rollout")` on a Ray actor's methods (or any
  class's), holding the group for each call with a client built per process from the
  `RLSLICE_*` environment.
- `rlslice.integrations.trl`: `GpuPhaseCallback`, a `transformers.TrainerCallback`-compatible
  callback (TRL's trainers are `transformers.Trainer`s) that holds the group for each
  optimizer step (or, `offer="asked"`, gives a rollout up at the next step end when asked).
- `rlslice.integrations.vllm`: `VllmRollout` / `AsyncVllmRollout`, a vLLM rollout that
  yields early (`mode="wait"` or `"abort"`) when a training step of another job waits.

None imports its framework: they are plain Python that the frameworks call, so they
cost nothing to import and work with any version that keeps the calling convention.
See docs/integrations.md for the recipes (TRL, verl, OpenRLHF, slime, Ray, vLLM, SGLang).
"""
