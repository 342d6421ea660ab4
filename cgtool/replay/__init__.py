"""`cgtool replay`: a slice of a trace run through cgtool's own model, KV pool and graphs under
the simulator's scheduling policy, measured against the simulator's prediction."""
