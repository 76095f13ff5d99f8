"""Procedural instance: a random tree under ./tree; prints the number of *.log files."""
import argparse, os, random
p = argparse.ArgumentParser(); p.add_argument("--seed", type=int, required=True)
rng = random.Random(p.parse_args().seed)
count = 0
dirs = ["tree"]
for i in range(rng.randint(3, 9)):
    d = os.path.join(rng.choice(dirs), f"d{i}")
    dirs.append(d)
for d in dirs:
    os.makedirs(d, exist_ok=True)
    for j in range(rng.randint(0, 6)):
        ext = rng.choice([".log", ".txt", ".dat", ".log.gz", ".log"])
        with open(os.path.join(d, f"f{j}{ext}"), "w") as f:
            f.write("x" * rng.randint(0, 50))
        count += ext == ".log"
    if rng.random() < 0.3:  # a directory named like a log file must not count
        os.makedirs(os.path.join(d, "old.log"), exist_ok=True)
print(count)
