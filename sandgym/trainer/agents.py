"""Agents: how a model turns observations into ACTIONs, with exact token bookkeeping.

`TerminalAgent` talks to the model through its chat template. Conventions the model is told in
its system prompt (and that `parse_action` understands, in this order):

- a fenced code block ```bash ... ``` (or ```sh, or an unlabelled fence) is a shell command;
- a JSON tool call, bare, fenced as ```json or wrapped in <tool_call>...</tool_call>:
  `{"name": "bash", "arguments": {"command": "..."}}` or `{"command": "..."}`; a tool name
  `submit` submits;
- `<submit/>` or a line that says only `submit` ends the episode. If the same reply also holds a
  command, the command runs first and the agent submits right after it.

A reply with no action gets a short local hint as the next user turn (no environment step). At
its turn limit the agent submits, so every episode is scored by the task's verifier.

Token bookkeeping (`Conversation`): the prompt of turn k+1 is built by *appending* to the tokens
of turn k (its prompt + the generated ids + the chat template's text between the assistant's end
token and the next generation prompt), rather than re-tokenising the whole chat, so the trainer
can merge a multi-turn episode into one sequence in which exactly the generated tokens carry
loss. Two things break the prefix on purpose and start a new sequence: dropping the oldest turns
when the prompt would exceed `max_context_tokens`, and a chat template whose rendering of earlier
turns changes when a turn is added. Observation text is cut to `max_observation_chars` (head and
tail kept, the middle elided with a marker).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandgym.trainer.config import AgentSettings

DEFAULT_SYSTEM_PROMPT = """You are an expert Linux user solving a task in a bash terminal.
Each reply: think briefly, then give exactly one shell command in a fenced block:
```bash
ls -la
```
You will see the command's output. When the task is done, reply with <submit/> to submit."""

NO_ACTION_HINT = (
    "No command found in your reply. Give one shell command in a ```bash fenced block, "
    "or reply <submit/> when the task is done."
)

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_SUBMIT = re.compile(r"<submit\s*/?>|^\s*submit\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass
class ParsedAction:
    """What one model reply asks for: a command (or other ACTION), a submit, or both."""

    action: dict[str, Any] | None = None
    submit: bool = False


def _tool_json(obj: Any) -> ParsedAction | None:
    if not isinstance(obj, dict):
        return None
    name = str(obj.get("name") or obj.get("tool") or "bash").lower()
    args = obj.get("arguments", obj.get("parameters", obj))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = {"command": args}
    if name == "submit":
        return ParsedAction(submit=True)
    if isinstance(args, dict) and isinstance(args.get("command"), str):
        return ParsedAction(action={"kind": "command", "command": args["command"]})
    return None


def parse_action(text: str) -> ParsedAction:
    """The action of a model reply (see the module docstring for the conventions).

    >>> parse_action("Let me look.\\n```bash\\nls /tmp\\n```").action
    {'kind': 'command', 'command': 'ls /tmp'}
    >>> parse_action('<tool_call>{"name": "submit"}</tool_call>').submit
    True
    """
    submit = bool(_SUBMIT.search(text))
    for m in _TOOL_CALL.finditer(text):
        try:
            parsed = _tool_json(json.loads(m.group(1)))
        except json.JSONDecodeError:
            parsed = None
        if parsed:
            parsed.submit = parsed.submit or submit
            return parsed
    for m in _FENCE.finditer(text):
        lang, body = m.group(1).lower(), m.group(2).strip()
        if lang == "json":
            try:
                parsed = _tool_json(json.loads(body))
            except json.JSONDecodeError:
                parsed = None
            if parsed:
                parsed.submit = parsed.submit or submit
                return parsed
            continue
        if lang in ("", "bash", "sh", "shell", "console") and body:
            if body.lower() == "submit":
                return ParsedAction(submit=True)
            return ParsedAction(action={"kind": "command", "command": body}, submit=submit)
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            parsed = _tool_json(json.loads(stripped))
        except json.JSONDecodeError:
            parsed = None
        if parsed:
            return parsed
    return ParsedAction(submit=submit)


def format_observation(obs: dict[str, Any] | None, max_chars: int) -> str:
    """Observation text for the model: output (or the screen), exit code, length-capped."""
    if not obs:
        return "(no output)"
    text = obs.get("output") or obs.get("screen") or ""
    if len(text) > max_chars:
        head = max_chars * 2 // 3
        tail = max_chars - head
        text = f"{text[:head]}\n[... {len(text) - max_chars} characters elided ...]\n{text[-tail:]}"
    code = obs.get("exit_code")
    suffix = f"\n[exit code {code}]" if code is not None else ""
    return (text if text.strip() else "(no output)") + suffix


@dataclass
class Conversation:
    """One episode's chat, kept both as messages and as the exact prompt token ids."""

    tokenizer: Any
    settings: AgentSettings
    max_new_tokens: int
    messages: list[dict[str, str]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    #: number of times the prompt was re-rendered from scratch (context dropped)
    rerenders: int = 0

    def _render(self, messages: list[dict[str, str]], gen: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def start(self, instruction: str, first_observation: dict[str, Any] | None) -> None:
        user = f"Task:\n{instruction.strip()}"
        if first_observation and (first_observation.get("output") or "").strip():
            obs = format_observation(first_observation, self.settings.max_observation_chars)
            user += f"\n\nTerminal:\n{obs}"
        self.messages = [
            {"role": "system", "content": self.settings.system_prompt or DEFAULT_SYSTEM_PROMPT},
            {"role": "user", "content": user},
        ]
        self.token_ids = self._encode(self._render(self.messages, gen=True))

    def add_response(self, text: str, response_ids: list[int], finished: bool) -> None:
        """Append what the model generated (ids exactly as sampled)."""
        self.token_ids = self.token_ids + list(response_ids)
        eos = self.tokenizer.eos_token_id
        if not finished and eos is not None:
            self.token_ids.append(eos)  # closes the turn; carried as prompt (mask 0) next time
        self.messages.append({"role": "assistant", "content": text})

    def add_user(self, content: str) -> None:
        before = self._render(self.messages, gen=False)
        self.messages.append({"role": "user", "content": content})
        after = self._render(self.messages, gen=True)
        eos_text = self.tokenizer.eos_token or ""
        cut = before.rfind(eos_text) if eos_text else -1
        if after.startswith(before) and cut >= 0:
            between = before[cut + len(eos_text) :] + after[len(before) :]
            self.token_ids = self.token_ids + self._encode(between)
        else:
            self._rerender()
        self._fit_budget()

    def _rerender(self) -> None:
        self.rerenders += 1
        self.token_ids = self._encode(self._render(self.messages, gen=True))

    def _fit_budget(self) -> None:
        budget = self.settings.max_context_tokens - self.max_new_tokens
        # keep the system prompt, the task, and the latest exchange; drop the oldest in pairs
        while len(self.token_ids) > budget and len(self.messages) > 4:
            del self.messages[2:4]
            self._rerender()


class TerminalAgent:
    """A multi-turn shell agent driven by a chat model (see the module docstring)."""

    name = "terminal"

    def __init__(self, tokenizer: Any, settings: AgentSettings, max_new_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.settings = settings
        self.max_new_tokens = max_new_tokens

    def new_conversation(
        self, instruction: str, first_observation: dict[str, Any] | None
    ) -> Conversation:
        conv = Conversation(self.tokenizer, self.settings, self.max_new_tokens)
        conv.start(instruction, first_observation)
        return conv

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


class NoopAgent:
    """Submits at once: the reward of an untouched sandbox (used by tests and baselines)."""

    name = "noop"


class OracleAgent:
    """Runs a task's reference solution, then submits: checks the reward path end to end.

    The env server does not hand solutions to clients, and the trainer does not import `tasks`,
    so the caller supplies them: `solutions` maps a task id to the text of its solve script
    (`solutions_from_dir` reads Harbor-style `<dir>/<name>/solution/solve.sh` files for ids
    `builtin/<name>` or `<name>`).
    """

    name = "oracle"
    script_path = "/tmp/sandgym_oracle_solve.sh"

    def __init__(self, solutions: dict[str, str]) -> None:
        self.solutions = solutions

    def actions(self, task_id: str) -> list[dict[str, Any]]:
        if task_id not in self.solutions:
            raise KeyError(
                f"oracle agent has no solution for {task_id!r}; it has {sorted(self.solutions)}"
            )
        return [
            {
                "kind": "write_file",
                "path": self.script_path,
                "content": self.solutions[task_id],
                "mode": 0o755,
            },
            {"kind": "command", "command": f"bash {self.script_path}"},
        ]


def solutions_from_dir(root: str | Path, prefix: str = "builtin/") -> dict[str, str]:
    """`{prefix + name: solve.sh text}` for every `root/<name>/solution/solve.sh`."""
    out: dict[str, str] = {}
    for script in sorted(Path(root).glob("*/solution/solve.sh")):
        out[prefix + script.parent.parent.name] = script.read_text(encoding="utf-8")
    return out
