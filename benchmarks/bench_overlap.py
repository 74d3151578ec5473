"""Deferred communication vs synchronous layers, swept over tokens per forward pass.

For each token count, one layer on GPU 0: the synchronous baseline (compute, then wait for the
communication) against the deferred pipeline (communication behind the next layer's compute), with
the speed-up ratio and the memory-bandwidth utilisation of both. On a sim rig the times are roofline
arithmetic over the profile (labelled SIM); on a GPU T_compute is measured with CuPy, T_comm over the
engine (tp=1) or a measured peer copy (tp>1), and the "achieved" column is the overlap really run.

Run: PYTHONPATH=. python benchmarks/bench_overlap.py [--sim rtx5080+rtx3090] [--tp 2] [--hidden 4096 --ffn 14336]
"""

from __future__ import annotations

import argparse

from gpudash.engine.profiles import PROFILES
from gpudash.advisor.baseline import measured_baseline, sim_baseline
from gpudash.advisor.overlap import LayerShape
from gpudash.telemetry.rig import NvmlRig, SimulatedRig, read_topology

TOKENS = (1, 16, 128, 1024, 4096)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", choices=sorted(PROFILES), default=None, help="sim rig (default: the real GPUs)")
    ap.add_argument("--tp", type=int, default=None, help="tensor-parallel GPUs (default: all)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=14336)
    args = ap.parse_args()
    topo = read_topology(SimulatedRig(args.sim) if args.sim else NvmlRig())
    tp = args.tp or len(topo.gpus)
    engine = None
    if not topo.is_sim:
        from gpudash.engine import EngineConfig, TransferEngine

        engine = TransferEngine(EngineConfig(backend="cuda"))
    label = f"{topo.source} SIM (arithmetic, not measured)" if topo.is_sim else topo.source
    print(f"bench_overlap [{label}] GPU 0, hidden {args.hidden}, ffn {args.ffn}, tp {tp}")
    print(f"{'tokens':>7}{'T_comp ms':>11}{'T_comm ms':>11}{'sync ms':>10}{'deferred ms':>13}{'ratio':>7}"
          f"{'achieved ms':>13}{'BW sync':>9}{'BW deferred':>13}{'depth':>7}")
    try:
        for t in TOKENS:
            shape = LayerShape(args.hidden, args.ffn, t, tp)
            rows = sim_baseline(topo, shape) if engine is None else measured_baseline(topo, shape, engine)
            r = rows[0]
            o = r.result
            achieved = f"{r.achieved_s * 1e3:.3f}" if r.achieved_s else "n/a"
            print(f"{t:>7}{o.t_compute_s * 1e3:>11.3f}{o.t_comm_s * 1e3:>11.3f}{o.t_serial_s * 1e3:>10.3f}"
                  f"{o.t_overlapped_s * 1e3:>13.3f}{o.t_serial_s / o.t_overlapped_s:>7.2f}{achieved:>13}"
                  f"{o.bw_util_serial:>9.0%}{o.bw_util_overlapped:>13.0%}{o.depth:>7}")
    finally:
        if engine is not None:
            engine.close()
    print("ratio = sync / deferred (ideal); achieved = the deferred pipeline run on the GPU (n/a on sim)")


if __name__ == "__main__":
    main()
