"""Procedural instance: a random ./sales.csv; prints the amount column's sum."""
import argparse, csv, random
from decimal import Decimal
p = argparse.ArgumentParser(); p.add_argument("--seed", type=int, required=True)
rng = random.Random(p.parse_args().seed)
cols = ["id", "region", "amount", "quantity"]
rng.shuffle(cols)  # the column's position changes per instance
total = Decimal(0)
with open("sales.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols)
    w.writeheader()
    for i in range(rng.randint(20, 80)):
        amount = Decimal(rng.randint(1, 500000)) / 100
        total += amount
        w.writerow({"id": i + 1, "region": rng.choice(["north", "south", "east", "west"]),
                    "amount": f"{amount:.2f}", "quantity": rng.randint(1, 40)})
print(f"{total:.2f}")
