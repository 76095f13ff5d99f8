"""What the training demo concludes, computed from what it measured (no hand-written figures).

- `check_heldout_disjoint`: the held-out instructions must not equal any training instruction
  (a procedural family's instruction changes with the seed; this checks it did, episode by
  episode, and the demo records the result);
- `check_heldout_novel`: stronger: no held-out instruction may share its *wording* with a
  training instruction (`wording_template`: the instruction with its paths, names, words and
  numbers replaced by placeholders), and the held-out set must ask at least one operation
  training never asked;
- `compare`: before/after success rates of one task with the difference's 95% interval, treating
  episodes as independent (kept for older records);
- `seed_level_compare`: the interval at the level of seeds, the unit that was sampled: the
  per-seed mean after minus before (paired: the same held-out seeds in both phases), with a
  cluster bootstrap over seeds and an exact sign-flip test;
- `summary_text`: the demo's one-paragraph conclusion, generated from the record's values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


class HeldoutOverlapError(ValueError):
    """A held-out episode's instruction also occurred in training (or nothing was recorded)."""


def check_heldout_disjoint(training: Iterable[str], heldout: Iterable[str]) -> dict[str, Any]:
    """Compare instruction strings (whitespace at the ends ignored); raise on any overlap.

    Returns `{"training_instructions": n, "heldout_instructions": m, "shared": 0}` (distinct
    strings), for the record."""
    train = {s.strip() for s in training if s.strip()}
    held = {s.strip() for s in heldout if s.strip()}
    if not train or not held:
        raise HeldoutOverlapError(
            f"expected instructions on both sides, found {len(train)} training and "
            f"{len(held)} held-out ones"
        )
    shared = sorted(train & held)
    if shared:
        raise HeldoutOverlapError(
            f"{len(shared)} held-out instruction(s) also occurred in training, "
            f"e.g. {shared[0][:200]!r}"
        )
    return {"training_instructions": len(train), "heldout_instructions": len(held), "shared": 0}


def wording_template(instruction: str) -> str:
    """The instruction's wording: `backticked` spans, quoted strings and numbers replaced by
    placeholders, whitespace collapsed. Two instances of one template share it whatever their
    paths and names."""
    import re

    text = re.sub(r"`[^`]*`", "<X>", instruction.strip())
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "<Q>", text)
    text = re.sub(r"\d+", "<N>", text)
    return " ".join(text.split())


def check_heldout_novel(
    training: Iterable[str], heldout: Iterable[str], operation_of: Any
) -> dict[str, Any]:
    """Raise HeldoutOverlapError when a held-out instruction's wording (`wording_template`) also
    occurs in training, or when the held-out set asks no operation (`operation_of(instruction)`)
    that training never asked. Returns the counts and the unseen operations, for the record."""
    train = [s for s in training if s.strip()]
    held = [s for s in heldout if s.strip()]
    if not train or not held:
        raise HeldoutOverlapError(
            f"expected instructions on both sides, found {len(train)} training and "
            f"{len(held)} held-out ones"
        )
    train_t = {wording_template(s) for s in train}
    held_t = {wording_template(s) for s in held}
    shared = sorted(train_t & held_t)
    if shared:
        raise HeldoutOverlapError(
            f"{len(shared)} held-out wording(s) also occurred in training (the same template "
            f"with other names), e.g. {shared[0][:200]!r}"
        )
    train_ops = {operation_of(s) for s in train}
    held_ops = {operation_of(s) for s in held}
    unseen = sorted(held_ops - train_ops)
    if not unseen:
        raise HeldoutOverlapError(
            f"every held-out operation {sorted(held_ops)} was asked in training: expected at "
            "least one never seen"
        )
    return {
        "training_templates": len(train_t),
        "heldout_templates": len(held_t),
        "shared_templates": 0,
        "unseen_operations": unseen,
        "heldout_operations": sorted(held_ops),
    }


def seed_level_compare(
    before: dict[int, list[float]],
    after: dict[int, list[float]],
    n_boot: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """After minus before at the level of seeds (`before`/`after`: rewards per held-out seed;
    the seeds must be the same in both phases). The unit of the interval is the seed, not the
    episode: episodes of one seed share its instance and are correlated. Returns the mean of
    the per-seed differences, a 95% cluster-bootstrap interval (seeds resampled with
    replacement), and the exact two-sided sign-flip (paired permutation) p-value."""
    import random

    if set(before) != set(after) or not before:
        raise ValueError(
            f"expected the same non-empty seeds in both phases, found {len(before)} before and "
            f"{len(after)} after ({len(set(before) ^ set(after))} differ)"
        )
    seeds = sorted(before)
    diffs = [sum(after[s]) / len(after[s]) - sum(before[s]) / len(before[s]) for s in seeds]
    n = len(diffs)
    mean = sum(diffs) / n
    rng = random.Random(seed)
    boots = sorted(sum(rng.choice(diffs) for _ in range(n)) / n for _ in range(n_boot))
    lo, hi = boots[int(0.025 * n_boot)], boots[int(0.975 * n_boot) - 1]
    # exact sign-flip test when small, else Monte Carlo with the same rng
    observed = abs(mean)
    if n <= 16:
        from itertools import product

        flips = list(product((1, -1), repeat=n))
        extreme = sum(
            1
            for f in flips
            if abs(sum(d * x for d, x in zip(diffs, f, strict=True))) / n >= observed - 1e-12
        )
        p = extreme / len(flips)
        exact = True
    else:
        draws = 20_000
        extreme = sum(
            1
            for _ in range(draws)
            if abs(sum(d * rng.choice((1, -1)) for d in diffs)) / n >= observed - 1e-12
        )
        p = (extreme + 1) / (draws + 1)
        exact = False
    return {
        "unit": "seed",
        "seeds": n,
        "delta": mean,
        "ci95": [lo, hi],
        "method": f"paired cluster bootstrap over seeds ({n_boot} resamples)",
        "excludes_zero": lo > 0 or hi < 0,
        "sign_flip_p": p,
        "sign_flip_exact": exact,
    }


def rewards_by_seed(
    episodes: Iterable[dict[str, Any]], task: str, phase: str
) -> dict[int, list[float]]:
    """Rewards of `task`'s episodes of `phase`, grouped by seed (episode records as dicts)."""
    out: dict[int, list[float]] = {}
    for e in episodes:
        if e.get("task_id") == task and e.get("phase") == phase and e.get("seed") is not None:
            out.setdefault(int(e["seed"]), []).append(float(e.get("reward", 0.0)))
    return out


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Difference of mean rewards (after - before) with a normal-approximation 95% interval
    from the two standard errors (the samples are independent draws at each phase)."""
    diff = after["mean_reward"] - before["mean_reward"]
    se = math.sqrt((before.get("stderr") or 0.0) ** 2 + (after.get("stderr") or 0.0) ** 2)
    lo, hi = diff - 1.96 * se, diff + 1.96 * se
    return {"delta": diff, "stderr": se, "ci95": [lo, hi], "excludes_zero": lo > 0 or hi < 0}


def _interval(res: dict[str, Any]) -> str:
    """The difference's interval in words: seed-level when the record has it."""
    sl = res.get("seed_level")
    if sl:
        verdict = "excludes zero" if sl["excludes_zero"] else "includes zero"
        return (
            f"{sl['delta']:+.2f} (seed-level 95% CI {sl['ci95'][0]:+.2f} to {sl['ci95'][1]:+.2f} "
            f"over {sl['seeds']} seeds, {verdict}; sign-flip p={sl['sign_flip_p']:.3f})"
        )
    c = res["comparison"]
    return (
        f"{c['delta']:+.2f} (episode-level 95% CI {c['ci95'][0]:+.2f} to {c['ci95'][1]:+.2f}, "
        f"{_verdict(c)}; episodes of a seed are correlated, so this interval is too narrow)"
    )


def _verdict(c: dict[str, Any]) -> str:
    if c["stderr"] == 0.0:
        return "no spread in either phase, so no interval"
    return "excludes zero" if c["excludes_zero"] else "includes zero"


def _rate(s: dict[str, Any]) -> str:
    return f"{s['mean_reward']:.2f} ({s['successes']}/{s['episodes']})"


def summary_text(record: dict[str, Any]) -> str:
    """The conclusion in words, built only from the record's measured values."""
    parts: list[str] = []
    check = record.get("heldout_instruction_check") or {}
    updates = record.get("updates")
    for task, res in (record.get("heldout") or {}).items():
        if "after" not in res:
            continue
        parts.append(
            f"{task}, held-out seeds ({res['before']['episodes']} episodes at "
            f"T={record['temperature']}): success {_rate(res['before'])} before, "
            f"{_rate(res['after'])} after {updates} GRPO updates, {_interval(res)}."
        )
    if check:
        parts.append(
            f"None of the {check.get('heldout_instructions')} distinct held-out instructions "
            f"equals any of the {check.get('training_instructions')} training instructions "
            "(checked string by string)."
            if check.get("ok")
            else f"Held-out check FAILED: {check.get('error')}"
        )
    for task, res in (record.get("transfer") or {}).items():
        if "after" not in res:
            continue
        parts.append(
            f"{task}, a family never trained on: {_rate(res['before'])} before, "
            f"{_rate(res['after'])} after, {_interval(res)}."
        )
    novelty = record.get("transfer_novelty_check")
    if novelty:
        parts.append(
            f"None of its {novelty['heldout_templates']} wordings occurs among the "
            f"{novelty['training_templates']} training wordings; operations never trained: "
            f"{', '.join(novelty['unseen_operations'])}."
            if novelty.get("ok")
            else f"Held-out novelty check FAILED: {novelty.get('error')}"
        )
    for task, phases in (record.get("by_operation") or {}).items():
        before, after = phases.get("eval-before") or {}, phases.get("eval-after") or {}
        cells = [
            f"{op} {before.get(op, {}).get('successes', 0)}/{before.get(op, {}).get('episodes', 0)}"
            f" -> {after.get(op, {}).get('successes', 0)}/{after.get(op, {}).get('episodes', 0)}"
            for op in sorted({*before, *after})
        ]
        if cells:
            parts.append(f"{task} by operation asked, before -> after: " + "; ".join(cells) + ".")
    kinds = record.get("heldout_by_instance_kind") or {}
    if kinds:
        cells = []
        for phase in ("eval-before", "eval-after"):
            for kind, c in sorted((kinds.get(phase) or {}).items()):
                cells.append(f"{phase[5:]} {kind} {c['successes']}/{c['episodes']}")
        parts.append("Held-out successes by instance kind: " + ", ".join(cells) + ".")
    look = record.get("successes_by_commands_after")
    if look:
        multi = sum(v for k, v in look.items() if k != "1" and k != "0")
        total = sum(look.values())
        parts.append(
            f"After training, {multi} of {total} successful held-out episodes ran two or more "
            f"commands (commands per success: {dict(sorted(look.items()))})."
        )
    if record.get("episodes"):
        parts.append(
            f"Training episodes solved: {record.get('train_successes')} of {record['episodes']}."
        )
    sig = record.get("groups_with_signal")
    if sig is not None and updates:
        parts.append(f"{sig} of {updates} updates had a group whose rewards differed.")
    rewards = record.get("train_reward_by_update") or []
    if rewards:
        k = max(1, len(rewards) // 4)
        first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
        parts.append(
            f"Training reward: mean {first:.2f} over the first {k} updates, {last:.2f} over "
            f"the last {k}."
        )
    return " ".join(parts)
