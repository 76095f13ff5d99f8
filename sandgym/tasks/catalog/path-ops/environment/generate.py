"""Procedural instance of path-ops: a directory of files (and one subdirectory) under /app, and
one thing to do there: create a directory, create an empty file, write a word into a new file,
delete a named file, delete the subdirectory with its contents, or delete the one file whose
name starts with a given prefix (the agent lists the directory to find it: look, then act).
The directory, names, operation and wording come from the seed; the instruction is written to
$SANDGYM_INSTRUCTION_FILE. Prints the instance as JSON (the verifier's secret)."""
import argparse, json, os, random, string

p = argparse.ArgumentParser(); p.add_argument("--seed", type=int, required=True)
rng = random.Random(p.parse_args().seed)
DIRS = ["home", "site", "jobs", "cache", "media", "build", "deploy", "tmpfiles", "vault", "mirror",
        "assets", "reports", "backup", "project", "tools"]
PREFIXES = ["config", "index", "table", "chart", "script", "readme", "sample", "result", "entry",
            "image", "backup", "server", "client", "module", "record", "status"]
WORDS = ["hello", "done", "ready", "ok", "yes", "blue", "sun", "apple", "tiger", "piano", "ocean",
         "north", "lemon", "maple", "seven", "delta"]
SUBDIRS = ["old", "tmp", "scratch", "trash", "draft", "logs", "parts", "spare"]
EXTS = [".txt", ".cfg", ".md", ".dat", ".log"]


def tag(n=4):
    return "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(n))


def text():
    return "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5))) + "\n"
                   for _ in range(rng.randint(1, 6)))


base = f"{rng.choice(DIRS)}_{rng.randint(100, 999)}"
prefixes = rng.sample(PREFIXES, rng.randint(4, 7))
files = {f"{p}_{tag()}{rng.choice(EXTS)}": text() for p in prefixes}
sub = f"{rng.choice(SUBDIRS)}_{tag(3)}"
sub_files = {f"{rng.choice(PREFIXES)}_{tag()}.txt": text() for _ in range(rng.randint(1, 3))}
os.makedirs(os.path.join(base, sub))
for n, content in files.items():
    with open(os.path.join(base, n), "w") as f:
        f.write(content)
for n, content in sub_files.items():
    with open(os.path.join(base, sub, n), "w") as f:
        f.write(content)

d = f"/app/{base}"
name = next(n for n in files if n.startswith(prefixes[0] + "_"))
new = f"{rng.choice(PREFIXES)}_{rng.choice(['new', 'v2', 'final', 'copy'])}_{tag(3)}"
word = rng.choice(WORDS)
# a look-then-act instance (delete by prefix) twice as often as each direct one
op = rng.choice(["mkdir", "touch", "write", "delete", "rmdir", "delete-prefix", "delete-prefix"])
path = None
if op == "mkdir":
    path = f"{d}/{new}"
    ask = rng.choice([f"Create the directory `{path}`.", f"Make a new directory `{path}`."])
elif op == "touch":
    path = f"{d}/{new}.txt"
    ask = rng.choice([f"Create an empty file `{path}`.", f"Make a new, empty file at `{path}`."])
elif op == "write":
    path = f"{d}/{new}.txt"
    ask = rng.choice([f"Write the word `{word}` into a new file `{path}`.",
                      f"Create the file `{path}` containing the single word `{word}`."])
elif op == "delete":
    path = f"{d}/{name}"
    ask = rng.choice([f"Delete the file `{path}`.", f"Remove the file `{path}`."])
elif op == "rmdir":
    path = f"{d}/{sub}"
    ask = rng.choice([f"Delete the directory `{path}` and everything in it.",
                      f"Remove the directory `{path}` with all of its contents."])
else:
    path = f"{d}/{name}"
    ask = rng.choice([f"Delete the one file in `{d}` whose name starts with `{prefixes[0]}`.",
                      f"Remove the file in `{d}` whose name begins with `{prefixes[0]}`."])
with open(os.environ["SANDGYM_INSTRUCTION_FILE"], "w") as f:
    f.write(ask + "\n")
# what must be left as it was: every file not named by the operation
keep = {f"{d}/{n}": c for n, c in files.items() if f"{d}/{n}" != path}
if op != "rmdir":
    keep.update({f"{d}/{sub}/{n}": c for n, c in sub_files.items()})
print(json.dumps({"op": op, "path": path, "word": word if op == "write" else None, "keep": keep}))
