"""Running inference servers: spec -> argv (argv.py), binaries and their flags (binary.py), health and ports
(health.py), the supervisor (supervisor.py), log facts (logparse.py), the /metrics source (metrics.py), the
probe workload (probe.py), TTFT/hit correlation (correlation.py), the demo model and default (gguf_model.py,
demo.py), and the stack that wires them for `launch` and `serve` (stack.py)."""
