"""GPU topology of this node, read from the hardware (see the modules for each source)."""
