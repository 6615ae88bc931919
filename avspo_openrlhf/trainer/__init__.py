"""OpenRLHF integration: flags (``config``, no OpenRLHF import), the experience maker, samples
generator and trainers (these import OpenRLHF, Ray and, on GPU, vLLM/flash-attn)."""
