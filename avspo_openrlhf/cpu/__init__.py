"""CPU-only adapters for running OpenRLHF without a GPU. Never imported on the GPU path."""
