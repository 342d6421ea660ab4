"""Planning from a workload trace: traces and converters, simulation, cost model, optimiser."""
