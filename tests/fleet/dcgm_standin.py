"""A stand-in for NVIDIA's dcgm-exporter: its /metrics as release 4.5.3-4.8.2 renders them, built from that
release's own default counters file (samples/dcgm-exporter-4.5.3-4.8.2-default-counters.csv) and its GPU
label set; see samples/PROVENANCE-dcgm-exporter.txt for what comes from where.

The values are made up but fixed per field and GPU (`value`), so a test can say what every figure read
through Prometheus must be. Run it as a program (`python dcgm_standin.py --port P --gpus JSON`) or use
`exposition()` in-process.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RELEASE = "4.5.3-4.8.2"
COUNTERS = Path(__file__).resolve().parent / "samples" / f"dcgm-exporter-{RELEASE}-default-counters.csv"
DRIVER = "580.95.05"  # the label counter DCGM_FI_DRIVER_VERSION's value

# Per field: the value of GPU 0 and the step from one GPU to the next (units as the counters file says).
_VALUES = {
    "DCGM_FI_DEV_SM_CLOCK": (1980, 0), "DCGM_FI_DEV_MEM_CLOCK": (2619, 0), "DCGM_FI_DEV_MEMORY_TEMP": (41, 1),
    "DCGM_FI_DEV_GPU_TEMP": (37, 2), "DCGM_FI_DEV_POWER_USAGE": (213.5, 11.25),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (123456789, 1000), "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": (0, 0),
    "DCGM_FI_DEV_GPU_UTIL": (37, 9), "DCGM_FI_DEV_MEM_COPY_UTIL": (12, 1), "DCGM_FI_DEV_ENC_UTIL": (0, 0),
    "DCGM_FI_DEV_DEC_UTIL": (0, 0), "DCGM_FI_DEV_XID_ERRORS": (0, 79), "DCGM_FI_DEV_FB_FREE": (100000, -1000),
    "DCGM_FI_DEV_FB_USED": (40000, 1000), "DCGM_FI_DEV_FB_RESERVED": (573, 0),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": (0, 0), "DCGM_FI_DEV_VGPU_LICENSE_STATUS": (0, 0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (0, 0), "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (0, 0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": (0, 0), "DCGM_FI_PROF_GR_ENGINE_ACTIVE": (0.42, 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (0.2, 0.01), "DCGM_FI_PROF_DRAM_ACTIVE": (0.3, 0.01),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (1.5e9, 1e8), "DCGM_FI_PROF_PCIE_RX_BYTES": (3.25e9, 1e8),
}


def counters() -> list[tuple[str, str, str]]:
    """(field, Prometheus type, help) of every line of the counters file, as dcgm-exporter reads it: CSV with
    '#' comments, each cell trimmed of spaces."""
    with COUNTERS.open(newline="", encoding="utf-8") as f:
        rows = [[cell.strip(" ") for cell in row] for row in csv.reader(f) if row and not row[0].startswith("#")]
    return [(r[0], r[1], r[2]) for r in rows]


def value(field: str, gpu: int) -> float:
    base, step = _VALUES[field]
    return base + step * gpu


def exposition(gpus: list[dict], hostname: str, prof: bool = True) -> str:
    """dcgm-exporter's /metrics for `gpus` ([{"gpu": 0, "uuid": ..., "model": ..., "pci_bus_id": ...}]);
    without `prof` the DCGM_FI_PROF_* fields are absent, as on a GPU without profiling metrics."""
    rows = counters()
    labels = {name: DRIVER for name, kind, _ in rows if kind == "label"}
    out = []
    for name, kind, doc in rows:
        if kind == "label" or (name.startswith("DCGM_FI_PROF_") and not prof):
            continue
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}")
        for g in gpus:
            tail = "".join(f',{k}="{v}"' for k, v in sorted(labels.items()))
            out.append(f'{name}{{gpu="{g["gpu"]}",UUID="{g["uuid"]}",pci_bus_id="{g["pci_bus_id"]}",'
                       f'device="nvidia{g["gpu"]}",modelName="{g["model"]}",Hostname="{hostname}"{tail}}} '
                       f'{value(name, int(g["gpu"])):g}')
    return "\n".join(out) + "\n"


def serve(host: str, port: int, text: str) -> ThreadingHTTPServer:
    body = text.encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return ThreadingHTTPServer((host, port), Handler)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--gpus", required=True, help="JSON list of {gpu, uuid, model, pci_bus_id}")
    ap.add_argument("--no-prof", action="store_true", help="leave the DCGM_FI_PROF_* fields out")
    args = ap.parse_args()
    hostname = os.environ.get("NODE_NAME") or socket.gethostname()
    serve(args.host, args.port, exposition(json.loads(args.gpus), hostname, not args.no_prof)).serve_forever()


if __name__ == "__main__":
    main()
