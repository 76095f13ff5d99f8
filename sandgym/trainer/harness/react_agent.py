#!/usr/bin/env python3
"""A small ReAct terminal agent that speaks the OpenAI chat API: the harness run *inside* a
sandbox. Standard library only (urllib), so it runs with whatever python3 the sandbox has.

    OPENAI_BASE_URL=http://gateway/sessions/<sid>/v1 \\
    SANDGYM_GATEWAY_SOCKET=/run/sandgym/gateway.sock \\
    python3 react_agent.py --task TASK.md [--max-turns 8] [--model NAME]

It offers two tools, `bash(command)` and `submit()`, runs each bash call with a timeout and
sends back the output as a `tool` message, and stops at `submit` or after `--max-turns`. With
`SANDGYM_GATEWAY_SOCKET` set, HTTP goes over that unix socket (the host part of the URL is then
ignored), which is how it reaches the model gateway from a sandbox whose network is off. It
keeps the whole history and echoes the assistant's messages unchanged, so the gateway can record
each call's tokens as an extension of the previous one. Prints one JSON line at the end.
"""

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import urllib.request

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run one shell command and see its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish: the task is done.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
SYSTEM = (
    "You are an expert Linux user solving a task in a bash terminal. Use the bash tool to run "
    "one command at a time (or reply with a ```bash block). When the task is done, call submit."
)


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (the host name only fills the Host header)."""

    def __init__(self, host, socket_path, timeout=None):
        super().__init__(host, timeout=timeout)
        self.socket_path = socket_path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class UnixHandler(urllib.request.HTTPHandler):
    def __init__(self, socket_path):
        super().__init__()
        self.socket_path = socket_path

    def http_open(self, req):
        return self.do_open(
            lambda host, timeout=None, **kw: UnixHTTPConnection(host, self.socket_path, timeout),
            req,
        )


def make_opener():
    path = os.environ.get("SANDGYM_GATEWAY_SOCKET")
    return urllib.request.build_opener(UnixHandler(path)) if path else urllib.request.build_opener()


def chat(opener, base_url, body, timeout_s):
    req = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ.get("OPENAI_API_KEY", "none"),
        },
        method="POST",
    )
    with opener.open(req, timeout=timeout_s) as resp:
        return json.loads(resp.read().decode())


def run_bash(command, timeout_s):
    try:
        p = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout_s)
        out = (p.stdout + p.stderr)[-4000:]
        return f"{out}\n[exit code {p.returncode}]"
    except subprocess.TimeoutExpired:
        return f"[timed out after {timeout_s} s]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", required=True, help="file holding the task's instruction")
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "sandgym-policy"))
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--command-timeout-s", type=float, default=30.0)
    ap.add_argument("--request-timeout-s", type=float, default=600.0)
    args = ap.parse_args()
    base_url = os.environ["OPENAI_BASE_URL"]
    with open(args.task, encoding="utf-8") as fh:
        task = fh.read()
    opener = make_opener()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    turns, commands, submitted = 0, 0, False
    while turns < args.max_turns and not submitted:
        turns += 1
        body = {"model": args.model, "messages": messages, "tools": TOOLS}
        body["max_tokens"] = args.max_tokens
        if args.temperature is not None:
            body["temperature"] = args.temperature
        msg = chat(opener, base_url, body, args.request_timeout_s)["choices"][0]["message"]
        reply = {"role": "assistant", "content": msg.get("content") or ""}
        if msg.get("tool_calls"):
            reply["tool_calls"] = msg["tool_calls"]
        messages.append(reply)
        if not msg.get("tool_calls"):
            messages.append(
                {"role": "user", "content": "Call the bash tool with a command, or submit."}
            )
            continue
        for call in msg["tool_calls"]:
            name = call["function"]["name"]
            if name == "submit":
                submitted = True
                break
            try:
                command = json.loads(call["function"].get("arguments") or "{}").get("command", "")
            except json.JSONDecodeError:
                command = ""
            out = run_bash(command, args.command_timeout_s) if command else "[no command given]"
            commands += 1
            messages.append(
                {"role": "tool", "tool_call_id": call.get("id", ""), "name": name, "content": out}
            )
    print(json.dumps({"turns": turns, "commands": commands, "submitted": submitted}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
