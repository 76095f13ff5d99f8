"""The training demo's held-out family (bench/train_demo.py): chores like path-ops' and
file-ops', worded in ways neither family ever words them, plus one operation neither asks
(making a file executable). bench.demo_stats.check_heldout_novel checks both against the
training episodes' instructions. Prints the instance as JSON (the verifier's secret); the
instruction goes to $SANDGYM_INSTRUCTION_FILE."""
import argparse, json, os, random, stat

p = argparse.ArgumentParser(); p.add_argument("--seed", type=int, required=True)
rng = random.Random(p.parse_args().seed)
DIRS = ["depot", "cellar", "attic", "ledger", "harbor", "orchard", "quarry", "meadow"]
NAMES = ["alpha", "bravo", "delta", "kilo", "lima", "oscar", "tango", "zulu"]
WORDS = ["amber", "basil", "cedar", "dune", "ember", "fjord", "glade", "heron"]
d = f"{rng.choice(DIRS)}{rng.randint(10, 99)}"
name = f"{rng.choice(NAMES)}_{rng.randint(100, 999)}"
os.makedirs(d)
op = rng.choice(["mkdir", "write", "delete", "chmod"])
if op == "mkdir":
    path = f"/app/{d}/{name}"
    ask = rng.choice([f"I need a folder called `{name}` inside `/app/{d}`; please set it up.",
                      f"Set up an empty folder at `{path}` for me."])
    secret = {"op": op, "path": path}
elif op == "write":
    path, word = f"/app/{d}/{name}.txt", rng.choice(WORDS)
    ask = rng.choice([f"Store the single word `{word}` in a brand-new file located at `{path}`.",
                      f"Put `{word}` (just that word) into a fresh file, `{path}`."])
    secret = {"op": op, "path": path, "word": word}
elif op == "delete":
    path = f"/app/{d}/{name}.tmp"
    with open(path[len("/app/"):], "w") as f:
        f.write("scratch\n")
    ask = rng.choice([f"Get rid of `{path}`, it is no longer needed.",
                      f"The scratch file `{path}` should not exist anymore; see to it."])
    secret = {"op": op, "path": path}
else:  # chmod: an operation neither training family asks
    path = f"/app/{d}/{name}.sh"
    with open(path[len("/app/"):], "w") as f:
        f.write("#!/bin/sh\necho ok\n")
    os.chmod(path[len("/app/"):], 0o644)
    ask = rng.choice([f"The script `{path}` cannot be run yet: allow its owner to execute it.",
                      f"Give `{path}` execute permission for its owner."])
    secret = {"op": op, "path": path}
with open(os.environ["SANDGYM_INSTRUCTION_FILE"], "w") as f:
    f.write(ask + "\n")
print(json.dumps(secret))
