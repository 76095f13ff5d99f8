"""Procedural instance: ./data.txt with random lines; prints its first line."""
import argparse, random
p = argparse.ArgumentParser(); p.add_argument("--seed", type=int, required=True)
rng = random.Random(p.parse_args().seed)
words = ["alpha", "beta", "gamma", "delta", "omega", "red", "green", "blue", "cat", "dog",
         "apple", "pear", "river", "stone", "cloud", "seven", "ninety", "1024", "x", "--"]
text = "".join(" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) + "\n"
               for _ in range(rng.randint(3, 30)))
with open("data.txt", "w") as f:
    f.write(text)
print(text.splitlines()[0])
