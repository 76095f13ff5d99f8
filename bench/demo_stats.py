"""What the training demo concludes, computed from what it measured (no hand-written figures).

- `check_heldout_disjoint`: the held-out instructions must not equal any training instruction
  (a procedural family's instruction changes with the seed; this checks it did, episode by
  episode, and the demo records the result);
- `compare`: before/after success rates of one task with the difference's 95% interval;
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


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Difference of mean rewards (after - before) with a normal-approximation 95% interval
    from the two standard errors (the samples are independent draws at each phase)."""
    diff = after["mean_reward"] - before["mean_reward"]
    se = math.sqrt((before.get("stderr") or 0.0) ** 2 + (after.get("stderr") or 0.0) ** 2)
    lo, hi = diff - 1.96 * se, diff + 1.96 * se
    return {"delta": diff, "stderr": se, "ci95": [lo, hi], "excludes_zero": lo > 0 or hi < 0}


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
        c = res["comparison"]
        verdict = _verdict(c)
        parts.append(
            f"{task}, held-out seeds ({res['before']['episodes']} episodes at "
            f"T={record['temperature']}): success {_rate(res['before'])} before, "
            f"{_rate(res['after'])} after {updates} GRPO updates, {c['delta']:+.2f} "
            f"(95% CI {c['ci95'][0]:+.2f} to {c['ci95'][1]:+.2f}, {verdict})."
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
        c = res["comparison"]
        verdict = _verdict(c)
        parts.append(
            f"{task}, a family never trained on: {_rate(res['before'])} before, "
            f"{_rate(res['after'])} after, {c['delta']:+.2f} (95% CI {c['ci95'][0]:+.2f} to "
            f"{c['ci95'][1]:+.2f}, {verdict})."
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
