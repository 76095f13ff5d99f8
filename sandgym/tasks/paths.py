"""Where things live inside a task's sandbox, by Harbor's conventions (one place for them all)."""

#: the agent's working directory unless the task or its Dockerfile names one
DEFAULT_WORKDIR = "/app"
#: the task's tests, copied in only when the verifier runs
TESTS_DIR = "/tests"
#: where the verifier writes `reward.txt` / `reward.json` (and pytest's JUnit report)
VERIFIER_LOGS = "/logs/verifier"
#: where Harbor's agents write their own logs
AGENT_LOGS = "/logs/agent"
#: files only the verifier sees (a procedural task's expected output)
SECRET_DIR = "/tests/secret"
#: the reference solution, copied in only for the oracle
SOLUTION_DIR = "/solution"
#: where Harbor's agents leave files for a separate verifier by convention
ARTIFACTS_DIR = "/logs/artifacts"
