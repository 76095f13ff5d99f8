"""Procedural instance: random integers in ./numbers.txt; prints them sorted."""
import argparse, random
p = argparse.ArgumentParser(); p.add_argument("--seed", type=int, required=True)
rng = random.Random(p.parse_args().seed)
nums = [rng.randint(-1000, 100000) for _ in range(rng.randint(30, 200))]
nums += rng.sample(nums, 3)  # guaranteed duplicates
with open("numbers.txt", "w") as f:
    f.write("\n".join(map(str, nums)) + "\n")
print("\n".join(map(str, sorted(nums))))
