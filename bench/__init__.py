"""bench: benchmarks that print JSON and write bench/results/*.json."""
