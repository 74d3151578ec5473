"""Engine vs native copy table (same as `gpudash bench engine`); run: python benchmarks/bench_engine.py [--backend sim]"""

from gpudash.cli import main

if __name__ == "__main__":
    import sys

    main(["bench", "engine", *sys.argv[1:]])
