"""What runs on the device: forward batches, the KV pool, eager forward, tensor-parallel groups, Triton launches."""
