"""The preload's Python side, in one place: the shared-memory contract with a process running
libgpudash_preload.so (shm), the live knobs gpudash sends such processes (knobs), and the telemetry
source that reads their stats blocks (source). The C side is csrc/preload/."""
