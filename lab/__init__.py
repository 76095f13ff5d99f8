"""Developer tooling that is not in the wheel: the benchmarks (`lab.bench`), the offline stand-in
image builder (`lab.images`). It uses the product through its public modules only."""
