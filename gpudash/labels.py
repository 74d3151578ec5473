"""Source labels as sessions, snapshots and exports store them ("nvml", "sim:<profile>"), and the UUIDs of
a sim rig's GPUs. The ground floor under records.py and telemetry/rig.py: it imports nothing of gpudash, so both
can read a label without importing each other. `SimulatedRig.label` writes the sim label through
`sim_label` and `rig.rig_of` is the one place that turns a label back into a rig."""

from __future__ import annotations

SIM_PREFIX = "sim:"
NVML_LABEL = "nvml"


def sim_label(profile: str) -> str:
    """The label of the simulated rig built from `profile` ("h200" -> "sim:h200")."""
    return f"{SIM_PREFIX}{profile}"


def sim_profile_of(label: str) -> str | None:
    """The profile of a stored sim label ("sim:h200" -> "h200"), None for anything else (nvml,
    replay:..., cuda): for labels read back from the store, whatever gpudash version wrote them."""
    return label.removeprefix(SIM_PREFIX) if label.startswith(SIM_PREFIX) else None


def is_sim_label(label: str) -> bool:
    """Whether a stored label names a simulated rig."""
    return sim_profile_of(label) is not None


def sim_uuid(profile: str, index: int) -> str:
    """A stable, obviously simulated UUID for GPU `index` of a sim rig."""
    return f"GPU-sim-{profile}-{index}"
