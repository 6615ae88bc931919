"""CPU-only adapters for running OpenRLHF without a GPU. Never imported on the GPU path, except the
stdlib-only ``dtype`` module, whose choices the flag parsers share."""
