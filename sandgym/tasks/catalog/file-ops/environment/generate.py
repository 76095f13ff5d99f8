"""Procedural instance of file-ops: a directory of files under /app, one of them to be copied,
moved, renamed or deleted. Which directory, which file (half the instances give only its name's
prefix: the agent lists the directory to find the rest), which operation and where to are all
drawn from the seed, and so is the wording: the instruction is written to
$SANDGYM_INSTRUCTION_FILE. Prints the instance as JSON (the verifier's secret)."""
import argparse, json, os, random, string

p = argparse.ArgumentParser(); p.add_argument("--seed", type=int, required=True)
rng = random.Random(p.parse_args().seed)
DIRS = ["inbox", "drop", "incoming", "batch", "spool", "queue", "archive", "work", "stage",
        "uploads", "shared", "exports", "scans", "records", "outbox"]
PREFIXES = ["report", "invoice", "notes", "draft", "summary", "ledger", "memo", "photo",
            "budget", "letter", "plan", "receipt", "todo", "minutes", "quote", "survey"]
WORDS = ["alpha", "beta", "gamma", "red", "green", "blue", "cat", "dog", "river", "stone",
         "cloud", "seven", "ninety", "apple", "pear", "north", "south", "1024", "x"]
EXTS = [".txt", ".csv", ".md", ".dat", ".log"]


def tag(n=4):
    return "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(n))


def text():
    return "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) + "\n"
                   for _ in range(rng.randint(2, 12)))


d1, d2 = rng.sample(DIRS, 2)
src_dir = f"{d1}_{rng.randint(100, 999)}"
prefixes = rng.sample(PREFIXES, rng.randint(4, 7))
prefix = prefixes[0]
files = {f"{p}_{tag()}{rng.choice(EXTS)}": text() for p in prefixes}
name = next(n for n in files if n.startswith(prefix + "_"))
os.makedirs(src_dir)
for n, content in files.items():
    with open(os.path.join(src_dir, n), "w") as f:
        f.write(content)

op = rng.choice(["copy", "move", "rename", "delete"])
src = f"/app/{src_dir}/{name}"
# Half the instances name the file in full (act at once); the others give only its directory
# and the prefix of its name, so the agent has to list the directory first (look, then act).
direct = rng.random() < 0.5
the = f"the file `{src}`" if direct else rng.choice([
    f"the file in `/app/{src_dir}` whose name starts with `{prefix}`",
    f"the one file in `/app/{src_dir}` whose name begins with `{prefix}`",
])
dest = None
if op == "copy":
    dest = f"/app/{rng.choice(PREFIXES)}-{rng.choice(['copy', 'backup', 'saved', 'kept'])}-{tag(3)}.txt"
    ask = rng.choice([f"Copy {the} to `{dest}`.", f"Make a copy of {the} at `{dest}`."])
elif op == "move":
    dest_dir = f"/app/{d2}_{rng.randint(100, 999)}"
    os.makedirs(dest_dir[len("/app/"):])
    dest = f"{dest_dir}/{name}"
    ask = rng.choice([f"Move {the} into the directory `{dest_dir}`.",
                      f"Move {the} into `{dest_dir}/`, keeping its name."])
elif op == "rename":
    new = f"{rng.choice(PREFIXES)}_{rng.choice(['final', 'old', 'done', 'v2', 'new'])}_{tag(3)}.txt"
    dest = f"/app/{src_dir}/{new}"
    ask = rng.choice([f"Rename {the} to `{new}` (in the same directory).",
                      f"Give {the} the new name `{new}`, in the same directory."])
else:
    ask = rng.choice([f"Delete {the}.", f"Remove {the}; leave the other files alone."])
with open(os.environ["SANDGYM_INSTRUCTION_FILE"], "w") as f:
    f.write(ask + "\n")
others = {n: c for n, c in files.items() if n != name}
print(json.dumps({"op": op, "direct": direct, "src": src, "dest": dest, "content": files[name],
                  "dir": f"/app/{src_dir}", "others": others}))
