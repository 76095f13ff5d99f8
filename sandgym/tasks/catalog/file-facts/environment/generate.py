"""Procedural instance of file-facts: a directory of files under /app; about the one whose name
starts with a given prefix (the agent lists the directory to find it), write its line count or
its first line to a new file, or append a given line to it. Directory, file, operation, paths
and wording come from the seed; the instruction is written to $SANDGYM_INSTRUCTION_FILE. Prints
the instance as JSON (the verifier's secret)."""
import argparse, json, os, random, string

p = argparse.ArgumentParser(); p.add_argument("--seed", type=int, required=True)
rng = random.Random(p.parse_args().seed)
DIRS = ["docs", "data", "texts", "files", "notes", "input", "logs", "papers", "drafts", "mail"]
PREFIXES = ["alpha", "orion", "maple", "cedar", "delta", "falcon", "harbor", "juniper", "lotus",
            "nova", "pine", "quartz", "raven", "sierra", "tango", "willow"]
WORDS = ["one", "two", "three", "red", "green", "blue", "sun", "moon", "tree", "rock", "wind",
         "fish", "bird", "road", "lamp", "door"]
EXTS = [".txt", ".md", ".text", ".lst"]


def tag(n=4):
    return "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(n))


def line():
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))


src_dir = f"{rng.choice(DIRS)}_{rng.randint(100, 999)}"
prefixes = rng.sample(PREFIXES, rng.randint(4, 7))
prefix = prefixes[0]
files = {f"{p}-{tag()}{rng.choice(EXTS)}": "".join(line() + "\n" for _ in range(rng.randint(2, 15)))
         for p in prefixes}
name = next(n for n in files if n.startswith(prefix + "-"))
os.makedirs(src_dir)
for n, content in files.items():
    with open(os.path.join(src_dir, n), "w") as f:
        f.write(content)

op = rng.choice(["count", "first", "append"])
look = rng.choice([
    f"The directory `/app/{src_dir}` contains several text files; exactly one has a name "
    f"starting with `{prefix}`.",
    f"In `/app/{src_dir}` exactly one file's name begins with `{prefix}`.",
])
out = f"/app/{rng.choice(['answer', 'result', 'out', 'fact'])}_{tag(3)}.txt"
extra = None
if op == "count":
    act = rng.choice([f"Write the number of lines of that file to `{out}`.",
                      f"Count its lines and put just that number in `{out}`."])
    expected = str(files[name].count("\n"))
elif op == "first":
    act = rng.choice([f"Write the first line of that file to `{out}`.",
                      f"Copy its first line (only that line) into `{out}`."])
    expected = files[name].splitlines()[0]
else:
    extra = f"{rng.choice(WORDS)} {rng.choice(WORDS)} {rng.randint(10, 99)}"
    out = f"/app/{src_dir}/{name}"
    act = rng.choice([f"Append the line `{extra}` to the end of that file.",
                      f"Add the line `{extra}` at the end of it, keeping its other lines."])
    expected = files[name] + extra + "\n"
with open(os.environ["SANDGYM_INSTRUCTION_FILE"], "w") as f:
    f.write(f"{look} {act}\n")
others = {n: c for n, c in files.items() if n != name}
print(json.dumps({"op": op, "out": out, "expected": expected, "dir": f"/app/{src_dir}",
                  "others": others}))
