"""bench: benchmarks that print JSON and write lab/bench/results/*.json."""
