"""Setup: a tree under ./www with mixed modes; prints the modes expected after o-w."""
import argparse, json, os
p = argparse.ArgumentParser(); p.add_argument("--seed", type=int, required=True); p.parse_args()
modes = {"": 0o777, "index.html": 0o666, "app.js": 0o664, "cgi": 0o777, "cgi/run.sh": 0o777,
         "cgi/lib.sh": 0o755, "img": 0o755, "img/logo.txt": 0o646, "private.txt": 0o640}
for rel in sorted(modes, key=len):
    path = os.path.join("www", rel)
    if rel in ("", "cgi", "img"):
        os.makedirs(path, exist_ok=True)
    else:
        with open(path, "w") as f:
            f.write(rel + "\n")
for rel, mode in modes.items():
    os.chmod(os.path.join("www", rel), mode)
print(json.dumps({rel: mode & ~0o002 for rel, mode in modes.items()}))
