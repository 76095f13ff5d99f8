"""Pairwise self-verification: the model picks the best of K candidate episodes.

Best-of-K needs a way to choose one answer without the verifier. Here the policy model itself
is the judge: it is shown the task and two candidates' transcripts (the commands each ran and
the output they got, i.e. the final state as the agent saw it) and asked which one solved the
task. A single-elimination tournament (`knockout`) ranks K candidates with exactly K-1
comparisons: each round pairs the survivors (a round's comparisons run concurrently, so the
engine batches them), an odd one out gets a bye.

Position bias is real for small models (they prefer "A" or "B" regardless); `PairwiseJudge`
with `swap=True` asks twice with the order swapped and only lets the challenger win when both
orders agree, which doubles the model calls (2(K-1) in all) but not the bound's shape. A reply
that names neither candidate counts as a vote for the incumbent (the first of the pair), so a
judge that says nothing useful degrades to "pick candidate 0", i.e. pass@1.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sandgym.trainer.engines.base import InferenceEngine, SamplingParams
from sandgym.trainer.episode import Episode

JUDGE_SYSTEM_PROMPT = (
    "You are a strict reviewer of Linux terminal work. Two attempts, A and B, tried the same "
    "task. Decide which attempt completed the task correctly. Answer with one letter: A or B."
)
_VERDICT = re.compile(r"\b(?:answer|attempt|winner)?\s*[:\-]?\s*\**([AB])\b")


def transcript(episode: Episode, max_chars: int = 1500) -> str:
    """The commands an episode ran and what they printed, newest kept when cut."""
    lines: list[str] = []
    for traj in episode.trajectories:
        for step in traj.steps:
            action = step.action or {}
            kind = action.get("kind")
            if kind == "command":
                lines.append(f"$ {action.get('command', '')}")
                out = (step.observation or {}).get("output") or ""
                if out.strip():
                    lines.append(out.strip()[-300:])
            elif kind == "write_file":
                lines.append(f"(wrote file {action.get('path')})")
            elif kind == "submit":
                lines.append("(submitted)")
            elif step.response_text and not action:
                lines.append(f"(said: {step.response_text.strip()[:200]})")
    text = "\n".join(lines) or "(did nothing)"
    if len(text) > max_chars:
        text = "[...]\n" + text[-max_chars:]
    return text


def parse_verdict(text: str) -> int | None:
    """0 for A, 1 for B, None when the reply names neither (first letter found wins).

    >>> parse_verdict("B"), parse_verdict("Answer: A."), parse_verdict("both fine")
    (1, 0, None)
    """
    m = _VERDICT.search(text.strip())
    if m is None:
        return None
    return 0 if m.group(1) == "A" else 1


@dataclass
class Comparison:
    """One head-to-head: candidate indices, who won, and the judge's raw replies."""

    a: int
    b: int
    winner: int
    replies: list[str] = field(default_factory=list)


CompareFn = Callable[[int, int], Awaitable[Comparison]]


async def knockout(n: int, compare: CompareFn) -> tuple[int, list[Comparison]]:
    """Single elimination over candidates 0..n-1: the winner and the n-1 comparisons made."""
    if n < 1:
        raise ValueError(f"knockout needs at least one candidate, got {n}")
    alive = list(range(n))
    played: list[Comparison] = []
    while len(alive) > 1:
        pairs = [(alive[i], alive[i + 1]) for i in range(0, len(alive) - 1, 2)]
        # a round's comparisons are independent: run them together (engines batch them)
        results = await asyncio.gather(*(compare(a, b) for a, b in pairs))
        nxt: list[int] = []
        for (a, b), c in zip(pairs, results, strict=True):
            if c.winner not in (a, b):
                raise ValueError(f"comparison of {c.a} and {c.b} returned winner {c.winner}")
            played.append(c)
            nxt.append(c.winner)
        if len(alive) % 2:
            nxt.append(alive[-1])  # bye
        alive = nxt
    return alive[0], played


class PairwiseJudge:
    """Asks a chat model (through an engine and its tokenizer) which of two episodes is right."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        *,
        swap: bool = True,
        max_new_tokens: int = 8,
        max_transcript_chars: int = 1500,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.swap = swap
        self.params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
        self.max_chars = max_transcript_chars
        self.calls = 0

    def prompt_ids(self, instruction: str, first: str, second: str) -> list[int]:
        user = (
            f"Task:\n{instruction.strip()}\n\nAttempt A:\n{first}\n\nAttempt B:\n{second}\n\n"
            "Which attempt completed the task correctly? Answer A or B."
        )
        msgs = [
            {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
            {"role": "user", "content": user},
        ]
        text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def _ask(self, instruction: str, first: str, second: str) -> tuple[int | None, str]:
        gen = await self.engine.agenerate(self.prompt_ids(instruction, first, second), self.params)
        self.calls += 1
        reply = str(self.tokenizer.decode(gen.token_ids, skip_special_tokens=True))
        return parse_verdict(reply), reply

    async def compare(self, instruction: str, a: Episode, b: Episode) -> tuple[bool, list[str]]:
        """Whether b (the challenger) beats a (the incumbent), and the judge's replies."""
        ta, tb = transcript(a, self.max_chars), transcript(b, self.max_chars)
        if not self.swap:
            v1, r1 = await self._ask(instruction, ta, tb)
            return v1 == 1, [r1]
        (v1, r1), (v2, r2) = await asyncio.gather(
            self._ask(instruction, ta, tb), self._ask(instruction, tb, ta)
        )
        return (v1 == 1 and v2 == 0), [r1, r2]

    async def select(
        self, instruction: str, candidates: list[Episode]
    ) -> tuple[int, list[Comparison]]:
        """Index of the chosen candidate, by knockout, and the comparisons made."""

        async def cmp(i: int, j: int) -> Comparison:
            b_wins, replies = await self.compare(instruction, candidates[i], candidates[j])
            return Comparison(i, j, j if b_wins else i, replies)

        return await knockout(len(candidates), cmp)
