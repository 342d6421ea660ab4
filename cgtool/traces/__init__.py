"""Request and batch traces: reading cgtool's format, converting public and log formats, statistics."""
