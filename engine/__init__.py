"""layerflow engine."""
