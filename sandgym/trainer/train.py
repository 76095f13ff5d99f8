"""The training driver: streams episodes from Ray rollout actors into learner updates.

Loop (one screen, in `Trainer.run`):

- keep `rollout.num_workers * rollout.concurrent_episodes` episodes in flight; each group is
  `algorithm.group_size` episodes of one task with one seed, dispatched to the least busy
  rollout actor; the servers are asked to prewarm sandboxes for the next groups' tasks;
- take each episode as soon as it finishes (`ray.wait`, no lock-step), append it to
  `episodes.jsonl`, and file it under its group;
- a finished group drops its infrastructure failures (they are not scored 0); it is kept if
  enough valid samples remain and its weights are at most `algorithm.max_staleness` updates
  old. Only what the agent cannot cause is masked (sandbox lost, connection, server errors): a
  `verifier_error` or `action_timeout` is a failed episode scored 0 (sandgym/trainer/episode.py);
- every `algorithm.groups_per_update` kept groups make one update: advantages, samples, a
  data-parallel learner step, then the new weights (with their version) go to every rollout
  actor while the other episodes keep running.

The run directory holds `config.yaml` (resolved), `metrics.jsonl`, `tensorboard/`,
`episodes.jsonl`, `eval_episodes.jsonl`, `checkpoints/` and `summary.json`. Creating
`RUN_DIR/STOP` ends the run early and cleanly (checkpoint and final evaluation still happen).

Why over 500 lines: the loop's bookkeeping (groups, staleness, prewarm, checkpoints, the final
evaluation, clean stop) is one object's state; the update step itself is sandgym/trainer/learner.py and
the episode loop sandgym/trainer/episode_runner.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from sandgym.client.env_client import AsyncEnvClient, EnvError
from sandgym.trainer.algorithms import (
    Sample,
    batch_advantages,
    episode_to_samples,
    mismatch_metrics,
)
from sandgym.trainer.builders import uses_model
from sandgym.trainer.cluster import EnvServerFleet, ServerBalancer, discover_servers, ray_servers
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.episode import Episode, EpisodeWriter
from sandgym.trainer.failures import unscored_fractions
from sandgym.trainer.inflight import abandon as abandon_inflight
from sandgym.trainer.inflight import forget as forget_inflight
from sandgym.trainer.inflight import recover_into_run
from sandgym.trainer.learner import LearnerGroup, latest_checkpoint
from sandgym.trainer.metrics import MetricsLogger
from sandgym.trainer.priority import local_ray_env
from sandgym.trainer.roles import role_metrics, role_samples
from sandgym.trainer.rollout import RolloutWorker
from sandgym.trainer.schedule import (
    engine_seed,
    prune_checkpoints,
    read_schedule,
    training_seed,
    write_schedule,
)

log = logging.getLogger(__name__)


class TrainError(RuntimeError):
    """The run cannot continue (e.g. every episode fails for infrastructure reasons)."""


#: a rollout worker whose engine refused this many weight pushes in a row stops the run
MAX_PUSH_FAILURES_IN_A_ROW = 3


def check_unscored_ceiling(fractions: dict[str, float], ceiling: float, version: int) -> None:
    """Raise TrainError when the unscored fraction of an update's episodes (`fractions`:
    sandgym.trainer.failures.unscored_fractions) passes `algorithm.max_masked_frac`."""
    total = fractions.get("masked/total", 0.0)
    if total > ceiling:
        causes = ", ".join(
            f"{k.split('/', 1)[1]} {v:.2f}"
            for k, v in sorted(fractions.items(), key=lambda kv: -kv[1])
            if k != "masked/total"
        )
        raise TrainError(
            f"update {version}: {total:.2f} of the episodes since the last update went unscored "
            f"(masked or their group dropped), past algorithm.max_masked_frac {ceiling:g}; by "
            f"cause: {causes}. Training on what is left would learn from a biased sample; see "
            "episodes.jsonl (termination, error) for the causes"
        )


def check_served_versions(served: list[int], learner_version: int, purpose: str) -> None:
    """Raise TrainError unless every rollout engine serves the learner's weights (`served`: the
    versions the engines report, which are those they really serve)."""
    wrong = {i: v for i, v in enumerate(served) if v != learner_version}
    if wrong:
        i, v = next(iter(wrong.items()))
        raise TrainError(
            f"{purpose} would not score the learner's weights: rollout engine {i} serves weights "
            f"of version {v} but the learner holds version {learner_version} "
            f"({len(wrong)} of {len(served)} engines differ; an engine that cannot take weights "
            "never serves the learner's)"
        )


class Trainer:
    def __init__(self, config: TrainConfig, run_dir: str | Path | None = None) -> None:
        self.config = config
        self.run_dir = Path(run_dir or Path(config.run.output_dir) / config.run.name)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._run_token = uuid.uuid4().hex[:8]  # makes this run's group ids unique
        (self.run_dir / "config.yaml").write_text(
            yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
        )
        self._prewarm_warned = False

    # -- setup ---------------------------------------------------------------------------------
    def _start(self) -> None:
        import ray

        cfg = self.config
        if not ray.is_initialized():
            if cfg.run.ray_address:
                ray.init(address=cfg.run.ray_address)
            else:
                # "local": a new instance of our own, never a cluster another process started
                # on this host (ray.init() with no address would attach to that one)
                local_ray_env()  # its workers at nice 0, not Ray's 15 (sandgym/trainer/priority.py)
                ray.init(address="local", num_cpus=cfg.run.ray_num_cpus, include_dashboard=False)
        self.learners = LearnerGroup(cfg)
        self.start_version = 0
        self.start_group = 0  # the task/seed schedule's next group (sandgym/trainer/schedule.py)
        ckpt = latest_checkpoint(self.run_dir) if cfg.run.resume else None
        if ckpt is not None:
            self.start_version = self.learners.load(ckpt[0])
            self.start_group = read_schedule(
                ckpt[0], self.start_version, cfg.algorithm.groups_per_update
            )
            log.info(
                "resumed from %s at version %d, group %d",
                ckpt[0], self.start_version, self.start_group,
            )  # fmt: skip
        if cfg.run.resume:  # episodes a killed trainer had in flight (sandgym/trainer/inflight.py)
            recover_into_run(self.run_dir, cfg.env.token, self.start_version)
        actor = ray.remote(RolloutWorker).options(
            num_cpus=cfg.rollout.num_cpus_per_worker,
            num_gpus=cfg.rollout.num_gpus_per_worker,
            max_concurrency=cfg.rollout.concurrent_episodes + 8,
        )
        # sampling seeds differ per worker, per (re)start of the run and per replacement
        self._restarts = [0] * cfg.rollout.num_workers
        # dispatched episode calls: their worker, what they were; refs lost with a dead actor
        self._busy = [0] * cfg.rollout.num_workers
        self._ref_worker: dict[Any, int] = {}
        self._ref_info: dict[Any, tuple[Any, str, str, int, str]] = {}
        self._lost_refs: set[Any] = set()
        self._new_rollout = lambda i: actor.remote(
            cfg.model_dump(),
            i,
            str(self.run_dir.resolve()),
            engine_seed(cfg.run.seed, i, self.start_version, self._restarts[i]),
        )
        self.rollouts: list[Any] = [self._new_rollout(i) for i in range(cfg.rollout.num_workers)]
        self._rollout_pending: dict[Any, int] = {}  # a replacement's first call -> its index
        self.version = self.start_version
        #: the version each rollout engine reports it serves (set by every weight push)
        self.served_versions = [0] * len(self.rollouts)
        self._start_servers()
        if self.start_version > 0:
            self._push_weights()

    def _start_servers(self) -> None:
        """The servers episodes go to: `env.server_urls` (started by hand) and, with
        `env.ray_servers`, one per Ray node offering `env.server_resource` (sandgym/trainer/cluster.py)."""
        env = self.config.env
        self.balancer = ServerBalancer(token=env.token)
        self.fleet: EnvServerFleet | None = None
        for url in env.server_urls:
            self.balancer.add(url)
        self.fleet, found = ray_servers(env.ray_servers, env.server_resource, env.server_settings)
        for info in found:
            self.balancer.add(info.url, placed=True)
        self._refreshed_at = 0.0
        self._refresh_servers(force=True)
        self._servers_seen_at = time.monotonic()
        log.info("env servers: %s", self.balancer.describe())

    def _refresh_servers(self, force: bool = False) -> None:
        """Every `env.refresh_s`: place servers on nodes that joined, forget those whose node
        died, pick up servers others placed, and ask each one its capacity."""
        env = self.config.env
        now = time.monotonic()
        if not force and now - self._refreshed_at < env.refresh_s:
            return
        self._refreshed_at = now
        if self.fleet is not None:
            started, lost = self.fleet.refresh()
            for info in lost:
                self.balancer.remove(info.url)
            for info in started:
                self.balancer.add(info.url, placed=True)
        if env.ray_servers != "off":
            known = {i.name for i in self.fleet.servers.values()} if self.fleet else set()
            for info in discover_servers(timeout_s=5.0, skip=known):
                self.balancer.add(info.url, placed=True)
        self.balancer.poll()
        if self.balancer.healthy_urls():
            self._servers_seen_at = now

    def _choose_server(self, n: int, strict: bool = True) -> str | None:
        """The least-loaded healthy server with room for `n` episodes; without `strict`, the
        least-loaded healthy one (its `capacity` refusal is then waited out at reset)."""
        url = self.balancer.choose(n)
        if url is None and not strict:
            healthy = [s for s in self.balancer.servers.values() if s.healthy]
            if healthy:
                url = min(healthy, key=lambda s: (s.in_flight, s.url)).url
        if url is None:
            self._refresh_servers()
            if time.monotonic() - self._servers_seen_at > self.config.env.no_server_timeout_s:
                raise TrainError(
                    f"no env server answered for {self.config.env.no_server_timeout_s:g}s: "
                    f"{self.balancer.describe()}"
                )
        return url

    def _push_weights(self) -> None:
        ref = self.learners.state_dict_ref(str((self.run_dir / "weights" / "learner").resolve()))
        ready = [i for i in range(len(self.rollouts)) if i not in self._rollout_pending.values()]
        calls = [(i, self.rollouts[i].update_weights.remote(ref, self.version)) for i in ready]
        for i, call in calls:
            self._await_push(i, call)

    def _await_push(self, i: int, call: Any) -> None:
        """The outcome of one rollout worker's weight push. Its engine answers the version it
        now serves (an engine that cannot take weights keeps its own). A dead actor is replaced
        (the replacement gets the weights when it answers); an engine that refused the weights
        (its load raised) keeps serving its old version, so its groups go stale and are dropped,
        and MAX_PUSH_FAILURES_IN_A_ROW refusals in a row stop the run; any other failure (the
        weights themselves lost with the learner) stops it at once."""
        import ray

        streak = self.__dict__.setdefault("_push_streak", {})
        try:
            served = int(ray.get(call))
        except ray.exceptions.RayActorError as exc:  # its node or process died
            self._replace_rollout(i, self.rollouts[i], exc)
            return
        except ray.exceptions.RayTaskError as exc:  # the engine raised while loading
            streak[i] = streak.get(i, 0) + 1
            log.error(
                "rollout engine %d refused the weights of version %d (%d in a row): %s",
                i, self.version, streak[i], str(exc)[:500],
            )  # fmt: skip
            if streak[i] >= MAX_PUSH_FAILURES_IN_A_ROW:
                raise TrainError(
                    f"rollout engine {i} refused {streak[i]} weight pushes in a row; last: "
                    f"{str(exc)[:1000]}"
                ) from exc
            return
        except ray.exceptions.RayError as exc:
            raise TrainError(
                f"weight push of version {self.version} to rollout engine {i} failed: "
                f"{type(exc).__name__}: {str(exc)[:1000]}"
            ) from exc
        streak[i] = 0
        self.served_versions[i] = served

    def _replace_rollout(self, i: int, dead: Any, exc: BaseException) -> None:
        """A rollout actor died (its node, its engine): start another; it gets work (and the
        current weights) once it answers."""
        import ray

        if self.rollouts[i] is not dead:  # replaced already
            return
        log.warning("rollout actor %d died (%s): starting a replacement", i, type(exc).__name__)
        try:  # (an actor only "unavailable" must not come back beside its replacement)
            ray.kill(dead, no_restart=True)
        except Exception:
            pass
        self._restarts[i] += 1
        # its episodes in flight are lost with it: they end now as infrastructure failures (Ray
        # may take long to fail their results, or never when the node is only unreachable; a
        # group waiting for them would hold its members and a slot of the run's concurrency)
        self._lost_refs.update(r for r, w in self._ref_worker.items() if w == i)
        self.rollouts[i] = self._new_rollout(i)
        self._busy[i] = 0
        self.served_versions[i] = 0
        self._rollout_pending[self.rollouts[i].stats.remote()] = i

    def _check_pending_rollouts(self) -> None:
        import ray

        if not self._rollout_pending:
            return
        done, _ = ray.wait(list(self._rollout_pending), num_returns=len(self._rollout_pending),
                           timeout=0)  # fmt: skip
        for ref in done:
            i = self._rollout_pending.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                self._replace_rollout(i, self.rollouts[i], exc)
                continue
            log.info("rollout actor %d is back", i)
            self.served_versions[i] = 0
            if self.version > 0:
                w = self.rollouts[i].update_weights.remote(
                    self.learners.state_dict_ref(
                        str((self.run_dir / "weights" / "learner").resolve())
                    ),
                    self.version,
                )
                self._await_push(i, w)

    # -- scheduling ----------------------------------------------------------------------------
    def _group_task(self, g: int) -> tuple[str, int]:
        env = self.config.env
        return env.task_ids[g % len(env.task_ids)], training_seed(env.seed_start, env.eval_seeds, g)

    def _prewarm(self, g: int) -> None:
        if not self.config.env.prewarm:
            return

        # where the next groups will run: the balancer's choices as things stand (the first is
        # group g's own server, its members not yet counted)
        plan = self.balancer.plan(3, self.config.algorithm.group_size)[1:]
        where: dict[str, set[str]] = {}
        for k, url in enumerate(plan, start=1):
            where.setdefault(url, set()).add(self._group_task(g + k)[0])
        for url, tasks in where.items():
            client = AsyncEnvClient(url, token=self.config.env.token)
            try:
                asyncio.run(client.prewarm(sorted(tasks), self.config.algorithm.group_size))
            except EnvError as exc:  # a hint to the pool: warn once, never stop the run
                if not self._prewarm_warned:
                    self._prewarm_warned = True
                    log.warning("prewarm on %s failed: %s", url, exc)

    def _dispatch(
        self,
        task_id: str,
        seed: int,
        group_id: str,
        greedy: bool = False,
        group_size: int = 0,
        url: str = "",
    ) -> Any:
        """One episode on the least busy rollout actor that is up, on server `url`."""
        pending = set(self._rollout_pending.values())
        up = [i for i in range(len(self.rollouts)) if i not in pending] or list(
            range(len(self.rollouts))
        )
        w = min(up, key=lambda i: self._busy[i])
        self._busy[w] += 1
        actor = self.rollouts[w]
        ref = actor.run_episode.remote(task_id, seed, group_id, greedy, group_size, url)
        self._ref_worker[ref] = w
        self._ref_info[ref] = (actor, url, task_id, seed, group_id)
        if url:
            self.balancer.acquire(url)
        return ref

    def _collect(self, ref: Any) -> Episode:
        """The episode a dispatched call returned; a rollout actor that died (its node, its
        engine) gives an infrastructure failure, masked like any other, and a replacement."""
        import ray

        w = self._ref_worker.pop(ref)
        self._busy[w] = max(0, self._busy[w] - 1)  # (0 after a replacement)
        actor, url, task_id, seed, group_id = self._ref_info.pop(ref)
        if url:
            self.balancer.release(url)
        if ref in self._lost_refs:  # its actor was replaced: never read what it may return
            self._lost_refs.discard(ref)
            ep = Episode(task_id=task_id, seed=seed, group_id=group_id, server_url=url)
            ep.termination = "error"
            ep.error = "rollout actor lost: replaced while the episode was in flight"
            log.warning("episode %s on %s: %s (masked)", group_id, url, ep.error)
            return ep
        try:
            ep = Episode.from_dict(ray.get(ref))
        except ray.exceptions.RayError as exc:
            ep = Episode(task_id=task_id, seed=seed, group_id=group_id, server_url=url)
            ep.termination = "error"
            ep.error = f"rollout actor lost: {type(exc).__name__}: {exc}"[:500]
            log.warning("episode %s on %s: %s (masked)", group_id, url, ep.error[:200])
            if isinstance(exc, ray.exceptions.RayActorError):
                self._replace_rollout(w, actor, exc)
        if ep.termination == "connection" and url:
            self.balancer.poll([url])  # gone? then no new group goes there
        return ep

    def _evaluate_server(self) -> str:
        while True:
            url = self._choose_server(1, strict=False)
            if url is not None:
                return url
            time.sleep(min(1.0, self.config.env.refresh_s))

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, tag: str) -> dict[str, float]:
        """Greedy episodes on the held-out seeds; mean reward."""
        import ray

        env = self.config.env
        if uses_model(self.config):  # never score other weights as the learner's
            live = [v for i, v in enumerate(self.served_versions)
                    if i not in self._rollout_pending.values()]  # fmt: skip
            check_served_versions(live, self.version, f"evaluation {tag}")
        refs = [
            self._dispatch(t, s, f"eval-{tag}-{t}-{s}", greedy=True, url=self._evaluate_server())
            for t in (env.eval_task_ids or env.task_ids)
            for s in env.eval_seeds
        ]
        ray.wait(refs, num_returns=len(refs))
        eps = [self._collect(r) for r in refs]
        for e in eps:
            self._eval_writer.write(e, eval_tag=tag, version=self.version)
            forget_inflight(self.run_dir, e)  # recorded: nothing to recover after a restart
        valid = [e for e in eps if not e.is_infra_failure]
        mean = sum(e.reward for e in valid) / len(valid) if valid else float("nan")
        return {
            "eval/reward_mean": mean,
            "eval/episodes": float(len(eps)),
            "eval/infra_failures": float(len(eps) - len(valid)),
        }

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        import ray
        from tqdm import tqdm

        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per prewarm is noise

        cfg, alg = self.config, self.config.algorithm
        self._start()
        metrics = MetricsLogger(self.run_dir)
        writer = EpisodeWriter(self.run_dir / "episodes.jsonl", with_tokens=cfg.run.save_tokens)
        self._eval_writer = EpisodeWriter(self.run_dir / "eval_episodes.jsonl")
        self._busy = [0] * len(self.rollouts)
        group_url = ""
        self._prewarm_warned = False
        summary: dict[str, Any] = {"run_dir": str(self.run_dir), "start_version": self.version}
        if cfg.run.eval_before:
            ev = self.evaluate(f"v{self.version}")
            metrics.log(self.version, ev)
            summary["eval_before"] = ev

        groups: dict[str, list[Episode]] = {}
        ready_groups: list[list[Episode]] = []
        in_flight: set[Any] = set()
        counts: Counter[str] = Counter()
        window: Counter[str] = Counter()  # terminations since the last update
        next_group, next_member = self.start_group, 0
        t_start = time.monotonic()
        episodes_done, gen_tokens = 0, 0
        bar = tqdm(
            total=cfg.run.num_updates,
            initial=self.version,
            desc="updates",
            disable=not cfg.run.progress,
            file=sys.stderr,
        )
        last_rewards: list[float] = []
        try:
            stop_file = self.run_dir / "STOP"
            stop_file.unlink(missing_ok=True)  # a leftover from an earlier stop
            while self.version < cfg.run.num_updates:
                if stop_file.exists():  # `touch RUN_DIR/STOP`: end early, still checkpoint+eval
                    log.info("%s exists: stopping after %d updates", stop_file, self.version)
                    summary["stopped_early"] = True
                    break
                self._refresh_servers()
                self._check_pending_rollouts()
                # rollout actors being replaced take no work meanwhile
                live = max(1, len(self.rollouts) - len(self._rollout_pending))
                while len(in_flight) < live * cfg.rollout.concurrent_episodes:
                    task_id, seed = self._group_task(next_group)
                    if next_member == 0:
                        # one server per group, chosen once: the least-loaded with room for it
                        chosen = self._choose_server(alg.group_size)
                        if chosen is None:
                            break  # no room anywhere: wait for episodes to end
                        group_url = chosen
                        self._prewarm(next_group)
                    # a group id unique on the servers (a snapshot per group lives there)
                    gid = f"{self._run_token}-g{next_group}"
                    in_flight.add(
                        self._dispatch(task_id, seed, gid, group_size=alg.group_size, url=group_url)
                    )
                    next_member += 1
                    if next_member == alg.group_size:
                        next_group, next_member = next_group + 1, 0
                if not in_flight:
                    time.sleep(min(1.0, cfg.env.refresh_s))
                    continue
                lost = [r for r in in_flight if r in self._lost_refs]
                done, _ = ray.wait(
                    list(in_flight),
                    num_returns=1,
                    timeout=0 if lost else min(60.0, cfg.env.refresh_s),
                )
                for ref in [*lost, *(r for r in done if r not in lost)]:
                    in_flight.discard(ref)
                    ep = self._collect(ref)
                    episodes_done += 1
                    gen_tokens += int(ep.metrics.get("generated_tokens", 0))
                    counts[ep.termination] += 1
                    window[ep.termination] += 1
                    writer.write(ep, received_at_version=self.version)
                    forget_inflight(self.run_dir, ep)  # recorded: nothing to recover (restart)
                    members = groups.setdefault(ep.group_id, [])
                    members.append(ep)
                    if len(members) == alg.group_size:
                        kept = self._admit_group(groups.pop(ep.group_id), counts)
                        if kept is not None:
                            ready_groups.append(kept)
                if (
                    episodes_done >= 20
                    and counts["__kept_groups"] == 0
                    and all(counts[r] == 0 for r in ("submitted", "turn_limit", "env_truncated"))
                ):
                    raise TrainError(
                        f"{episodes_done} episodes and none finished normally: {dict(counts)}; "
                        f"see {self.run_dir / 'episodes.jsonl'}"
                    )
                if len(ready_groups) < alg.groups_per_update:
                    continue
                batch, ready_groups = (
                    ready_groups[: alg.groups_per_update],
                    ready_groups[alg.groups_per_update :],
                )
                unscored = unscored_fractions(window)
                check_unscored_ceiling(unscored, alg.max_masked_frac, self.version + 1)
                window.clear()
                m = self._update(batch, counts)
                m.update(unscored)
                elapsed = time.monotonic() - t_start
                m["throughput/episodes_per_s"] = episodes_done / elapsed
                m["throughput/generated_tokens_per_s"] = gen_tokens / elapsed
                m["episodes/total"] = float(episodes_done)
                for key, n in counts.items():
                    # "__x" are group counters; the rest are termination reasons
                    name = f"groups/{key[2:]}" if key.startswith("__") else f"termination/{key}"
                    m[name] = float(n)
                if cfg.run.eval_every and self.version % cfg.run.eval_every == 0:
                    m.update(self.evaluate(f"v{self.version}"))
                metrics.log(self.version, m)
                last_rewards.append(m["reward/mean"])
                bar.update(1)
                bar.set_postfix(
                    reward=f"{m['reward/mean']:.3f}",
                    eps_s=f"{m['throughput/episodes_per_s']:.2f}",
                    tok_s=f"{m['throughput/generated_tokens_per_s']:.0f}",
                )
                every = cfg.run.checkpoint_every
                if every and self.version % every == 0:
                    self._checkpoint(next_group + (1 if next_member else 0))
            bar.close()
            if (
                cfg.run.num_updates > self.start_version
                or not (self.run_dir / "checkpoints").exists()
            ):
                self._checkpoint(next_group + (1 if next_member else 0))
            if cfg.run.eval_before or cfg.run.eval_every:
                ev = self.evaluate(f"v{self.version}")
                metrics.log(self.version, ev)
                summary["eval_after"] = ev
        finally:
            bar.close()
            writer.close()
            self._eval_writer.close()
            metrics.close()
        summary.update(
            {
                "version": self.version,
                "episodes": episodes_done,
                "terminations": {k: v for k, v in counts.items() if not k.startswith("__")},
                "groups": {k[2:]: v for k, v in counts.items() if k.startswith("__")},
                "reward_by_update": last_rewards,
                "wall_s": time.monotonic() - t_start,
                "generated_tokens": gen_tokens,
            }
        )
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self._completed = True  # the episodes still in flight are past the run's end
        return summary

    def _checkpoint(self, next_group: int) -> None:
        """Weights and optimizer (the learners), the schedule's next group, then older
        checkpoints beyond `run.keep_checkpoints` removed (sandgym/trainer/schedule.py)."""
        path = self.run_dir / "checkpoints" / f"step_{self.version:06d}"
        self.learners.save(str(path))
        write_schedule(path, next_group, self.version)
        for old in prune_checkpoints(path.parent, self.config.run.keep_checkpoints):
            log.info("removed checkpoint %s (run.keep_checkpoints)", old)

    def _admit_group(self, members: list[Episode], counts: Counter[str]) -> list[Episode] | None:
        """Mask infrastructure failures (`Episode.is_infra_failure`: never a failure the agent
        can cause, such as a verifier it made time out); drop a group with a failure the policy
        may have caused that looks like infrastructure (`Episode.drops_group`), and groups without
        usable signal; each drop counted by cause."""
        alg = self.config.algorithm
        dropping = [e.termination for e in members if e.drops_group]
        if dropping:  # the policy may have caused it: neither masked nor scored (failures.py)
            counts[f"__dropped_groups_{dropping[0]}"] += 1
            return None
        valid = [e for e in members if not e.is_infra_failure]
        need = 1 if alg.estimator == "reinforce" else 2
        if len(valid) < need:
            counts["__dropped_groups_infra"] += 1
            return None
        if alg.skip_zero_variance_groups and len({e.reward for e in valid}) == 1:
            counts["__dropped_groups_zero_variance"] += 1
            return None
        counts["__kept_groups"] += 1
        return valid

    def _update(self, batch: list[list[Episode]], counts: Counter[str]) -> dict[str, float]:
        alg = self.config.algorithm
        fresh = [
            g
            for g in batch
            if min(e.min_policy_version for e in g) >= self.version - alg.max_staleness
        ]
        counts["__dropped_groups_stale"] += len(batch) - len(fresh)
        train_all = alg.entropy_coef > 0 or alg.kl_coef > 0
        samples: list[Sample] = []
        per_role: dict[str, float] = {}
        if alg.roles or any(len(e.trajectories) > 1 for g in fresh for e in g):
            # multi-role episodes: per-role advantages over each role's own trajectories

            per_role = role_metrics(fresh)

            samples = role_samples(
                fresh,
                alg.roles,
                alg.estimator,
                std_normalize=alg.std_normalize,
                keep_zero=train_all,
            )
        else:
            advs = batch_advantages(fresh, alg.estimator, std_normalize=alg.std_normalize)
            for g, ga in zip(fresh, advs, strict=True):
                for ep, a in zip(g, ga, strict=True):
                    if a != 0.0 or train_all:  # a zero advantage has a zero policy gradient
                        samples += episode_to_samples(ep, a)
        rewards = [e.reward for g in batch for e in g]
        m: dict[str, float] = {
            "reward/mean": sum(rewards) / len(rewards),
            "reward/max": max(rewards),
            "reward/min": min(rewards),
            "batch/groups": float(len(fresh)),
            "batch/samples": float(len(samples)),
            "batch/staleness_mean": sum(
                self.version - e.min_policy_version for g in fresh for e in g
            )
            / max(1, sum(len(g) for g in fresh)),
            "episode/turns_mean": sum(e.metrics.get("turns", 0.0) for g in batch for e in g)
            / len(rewards),
            **per_role,
        }
        t = time.monotonic()
        # an empty batch still takes a (zero-gradient) step so that versions stay in step
        stats = self.learners.train(samples)
        self.version = self.learners.version
        update_s = time.monotonic() - t
        tokens = stats.get("loss_tokens", 0.0)
        seq_tokens = sum(len(s.input_ids) for s in samples)
        if tokens:
            for key in ("pg_loss", "entropy", "kl", "clip_frac", "logprob_diff"):
                m[f"loss/{key}"] = stats[f"{key}_sum"] / tokens
            m["loss/total"] = stats["loss_sum"]
            m["loss/grad_norm"] = stats["grad_norm"]
        # engine/learner mismatch of the sampled tokens (tis/ratio_mean, capped_frac, ...)
        m.update(mismatch_metrics(stats, self.config.tis_enabled))
        m["learner/update_s"] = update_s
        m["learner/tokens_per_s"] = seq_tokens / update_s if update_s > 0 else 0.0
        m["learner/loss_tokens"] = tokens
        t = time.monotonic()
        self._push_weights()
        m["learner/push_s"] = time.monotonic() - t
        m["version"] = float(self.version)
        return m

    def shutdown(self) -> None:
        import ray

        for r in getattr(self, "rollouts", []):
            ray.kill(r)
        if getattr(self, "_completed", False):  # a finished run resumes none of them
            abandon_inflight(self.run_dir)
            # lazy: a harness run's calls only; loads fastapi (+0.13 s CPU, measured) into every
            # `sandgym` command's start (trainer/cli.py imports this module)
            from sandgym.trainer.gateway.records import drop_abandoned_calls

            drop_abandoned_calls(self.run_dir / "gateway")  # their harness calls likewise
        fleet = getattr(self, "fleet", None)
        if fleet is not None:
            fleet.stop()  # drained: their sandboxes are removed
        if hasattr(self, "learners"):
            self.learners.shutdown()
