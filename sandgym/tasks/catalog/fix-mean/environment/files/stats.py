"""Print the mean of the numbers in a file (one per line), rounded to 2 decimals."""
import sys


def mean(path):
    values = [int(line) for line in open(path)]
    return sum(values) // len(values)


if __name__ == "__main__":
    print(f"{mean(sys.argv[1]):.2f}")
