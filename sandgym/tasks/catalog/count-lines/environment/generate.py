"""Procedural instance: ./data.txt with a random number of random lines; prints that number."""
import argparse, random
p = argparse.ArgumentParser(); p.add_argument("--seed", type=int, required=True)
rng = random.Random(p.parse_args().seed)
words = ["alpha", "beta", "gamma", "delta", "omega", "red", "green", "blue", "cat", "dog",
         "apple", "pear", "river", "stone", "cloud", "seven", "ninety", "1024", "x", "--"]
n = rng.randint(5, 80)
with open("data.txt", "w") as f:
    for _ in range(n):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) + "\n")
print(n)
