"""The files cgtool writes and reads back: capture reports, plans, their I/O, provenance, invariants and check's comparison."""
