"""CPU-only adapters for running OpenRLHF without a GPU. Never imported on the GPU path, except the
light ``dtype`` module (which CPU precision ``auto`` means on this machine)."""
