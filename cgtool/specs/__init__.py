"""Plain, torch-free specifications: model shapes and presets, GPUs, vision towers, hidden-state modes."""
