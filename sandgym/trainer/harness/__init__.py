"""Harness agents: OpenAI-API programs run inside sandboxes, trained through the model gateway.

`react_agent.py` is the shipped harness (stdlib only); `HarnessRunner` plays an episode with it.
"""

from sandgym.trainer.harness.runner import AGENT_SCRIPT, HarnessRunner

__all__ = ["AGENT_SCRIPT", "HarnessRunner"]
