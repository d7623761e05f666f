"""Device-side helpers, one module per step of the forward pass."""
