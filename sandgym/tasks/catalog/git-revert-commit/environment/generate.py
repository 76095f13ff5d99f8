import argparse, json, os, subprocess
p = argparse.ArgumentParser(); p.add_argument("--seed", type=int, required=True); p.parse_args()
ENV = {**os.environ, "GIT_AUTHOR_NAME": "Dev", "GIT_AUTHOR_EMAIL": "dev@example.com",
       "GIT_COMMITTER_NAME": "Dev", "GIT_COMMITTER_EMAIL": "dev@example.com",
       "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}
def git(*args, cwd="repo"):
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True, text=True).stdout.strip()
def put(path, text):
    os.makedirs(os.path.dirname(os.path.join("repo", path)) or "repo", exist_ok=True)
    with open(os.path.join("repo", path), "w") as f:
        f.write(text)
def commit(msg):
    git("add", "-A"); git("commit", "-q", "-m", msg); return git("rev-parse", "HEAD")
os.makedirs("repo", exist_ok=True)
git("init", "-q", "-b", "main")
git("config", "user.name", "Dev"); git("config", "user.email", "dev@example.com")

put("config.txt", "timeout=30\nretries=3\n"); commit("add config")
put("docs.md", "docs\n"); commit("add docs")
put("config.txt", "timeout=0\nretries=3\n"); bad = commit("bump timeout")
put("CHANGELOG.md", "changes\n"); tip = commit("add changelog")
print(json.dumps({"bad": bad, "tip": tip}))
