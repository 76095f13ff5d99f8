"""Pairwise self-verification: knockout bounds, verdict parsing, swap check, transcripts."""

from __future__ import annotations

from typing import Any

import pytest

from sandgym.trainer.engines.base import Generation, InferenceEngine, SamplingParams
from sandgym.trainer.episode import Episode, Step, Trajectory
from sandgym.trainer.selection import Comparison, PairwiseJudge, knockout, parse_verdict, transcript


def _episode(seed: int, command: str, output: str, reward: float) -> Episode:
    step = Step([], [], [], [], action={"kind": "command", "command": command})
    step.observation = {"output": output}
    sub = Step([], [], [], [], action={"kind": "submit"})
    return Episode("t", seed, [Trajectory("agent", [step, sub], reward)], instruction="do it")


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
async def test_knockout_uses_n_minus_1_comparisons_and_finds_the_best(n: int) -> None:
    strength = [(i * 7) % n for i in range(n)]  # a permutation: one strongest candidate

    async def cmp(a: int, b: int) -> Comparison:
        return Comparison(a, b, a if strength[a] > strength[b] else b)

    winner, played = await knockout(n, cmp)
    assert len(played) == n - 1
    assert strength[winner] == max(strength)
    # every candidate but the winner lost exactly once
    losers = sorted(c.a if c.winner == c.b else c.b for c in played)
    assert losers == sorted(set(range(n)) - {winner})


async def test_knockout_rejects_a_winner_outside_the_pair() -> None:
    async def bad(a: int, b: int) -> Comparison:
        return Comparison(a, b, 99)

    with pytest.raises(ValueError, match="winner 99"):
        await knockout(2, bad)
    with pytest.raises(ValueError, match="at least one"):
        await knockout(0, bad)


def test_parse_verdict() -> None:
    assert parse_verdict("A") == 0
    assert parse_verdict("**B** is right") == 1
    assert parse_verdict("Answer: B") == 1
    assert parse_verdict("neither") is None
    assert parse_verdict("") is None


def test_transcript_shows_commands_and_outputs_not_rewards() -> None:
    text = transcript(_episode(0, "echo hi > f", "done", 1.0))
    assert "$ echo hi > f" in text and "done" in text and "(submitted)" in text
    assert "1.0" not in text and "reward" not in text
    long = transcript(_episode(0, "x" * 5000, "", 0.0), max_chars=100)
    assert long.startswith("[...]") and len(long) <= 110


class KeywordJudgeEngine(InferenceEngine):
    """Test double for the judge model: answers with the position of the attempt whose
    transcript holds `good`, or with a fixed letter (a position-biased judge)."""

    def __init__(self, tok: Any, good: str | None, fixed: str = "A") -> None:
        super().__init__(batch_wait_s=0.0)
        self.tok, self.good, self.fixed = tok, good, fixed

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            a, b = text.split("Attempt A:")[1].split("Attempt B:")
            answer = self.fixed
            if self.good is not None:
                answer = "A" if self.good in a else "B"
            ids = self.tok(answer, add_special_tokens=False)["input_ids"]
            out.append(Generation(ids, [0.0] * len(ids), "length"))
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


@pytest.fixture(scope="module")
def tok() -> Any:
    from sandgym.trainer.config import ModelSettings
    from sandgym.trainer.models import load_tokenizer

    return load_tokenizer(ModelSettings(source="tiny"))


async def test_judge_selects_the_correct_candidate(tok: Any) -> None:
    cands = [_episode(i, f"try {i}", "wrong", 0.0) for i in range(5)]
    cands[3] = _episode(3, "the fix", "GOOD", 1.0)
    judge = PairwiseJudge(KeywordJudgeEngine(tok, "GOOD"), tok)
    idx, comps = await judge.select("do it", cands)
    assert idx == 3 and len(comps) == 4
    assert judge.calls == 8  # two orders per comparison


async def test_swap_check_neutralises_a_position_biased_judge(tok: Any) -> None:
    cands = [_episode(i, f"try {i}", "x", float(i == 0)) for i in range(4)]
    for letter in ("A", "B"):
        judge = PairwiseJudge(KeywordJudgeEngine(tok, None, letter), tok)
        idx, _ = await judge.select("do it", cands)
        assert idx == 0  # the incumbent keeps its place when the two orders disagree
    # without the swap check, an always-"B" judge crowns the last challenger
    judge = PairwiseJudge(KeywordJudgeEngine(tok, None, "B"), tok, swap=False)
    idx, _ = await judge.select("do it", cands)
    assert idx == 3
