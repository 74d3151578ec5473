"""Engine vs native copies, side by side (the table `gpudash bench engine` prints), needing only the
engine package (plus CuPy for --backend cuda). Run: python benchmarks/bench_engine.py --backend sim

--tune sweeps chunk sizes / fallback thresholds / staging threads first and benches with the result
(it prints the knobs; `gpudash bench engine --tune` also writes them into the user config).
"""

from __future__ import annotations

import argparse
import json
import sys

from gpudash.engine import EngineConfig, TransferEngine
from gpudash.engine.autotune import tune
from gpudash.engine.bench import bench_title, check_engine, relay_figure, render, render_tune, run_bench, side_for
from gpudash.engine.profiles import PROFILES

SIZE_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def _parse_size(text: str) -> int:
    for unit, mult in SIZE_UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cuda", "sim"], default="sim")
    ap.add_argument("--profile", choices=sorted(PROFILES), default="h200")
    ap.add_argument("--sizes", default=None, help="comma-separated, e.g. 64KiB,1GiB")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--set", action="append", default=[], help="knob=value applied before the bench")
    args = ap.parse_args(argv)
    sizes = tuple(_parse_size(s) for s in args.sizes.split(",")) if args.sizes else None
    with TransferEngine(EngineConfig(backend=args.backend, profile=args.profile)) as eng:
        check_engine(eng)
        if args.set:
            eng.set(**{k: (v == "True") if v in ("True", "False") else int(v)
                       for k, v in (kv.split("=", 1) for kv in args.set)})
        res = None
        if args.tune:
            res = tune(eng, progress=lambda m: print(f"  ... {m}", file=sys.stderr))
            eng.set(**res.knobs)
            print(render_tune(res), flush=True)
        rows = list(run_bench(eng, sizes, progress=lambda m: print(f"  ... {m}", file=sys.stderr)))
        fig = relay_figure("8xh20")
        if args.json:
            print(json.dumps({"backend": args.backend, "knobs": eng.knobs(), "rows": [r.as_dict() for r in rows],
                              "tune": res.knobs if res else None,
                              "relay_8xh20_sim": {"measured_gbps": fig.measured_gbps, "model_gbps": fig.model_gbps}}))
        else:
            print(render(bench_title(eng), eng.knobs(), side_for(eng).label, rows, fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
