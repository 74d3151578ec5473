"""The one place a run is assembled and changed: the session (engine, sources, sampler, recording), the
live and recorded feeds, the launch stack and its demo, the controller (every change, from the CLI and the
TUI alike) and the knobs tuned on this machine. `launch`, `record`, `serve` and `replay` each ask this
package for a run; the TUI and the commands sit above it and wire nothing themselves."""
